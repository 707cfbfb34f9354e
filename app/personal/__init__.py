"""Personal data in free text, whatever its encoding: where it is (``decoded``, ``shapes``).
What a viewer sees of it is ``app.masking``'s."""
