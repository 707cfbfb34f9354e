"""Personal data in free text, whatever its encoding: a text's reading with its escapes undone
(``decoded``), the values an answer was told about (``known``), the shapes found without being
told (``shapes``), the two together (``finder``), and what a viewer sees of it (``masking``)."""
