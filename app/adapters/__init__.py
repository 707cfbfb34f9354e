"""The real implementations of the pipeline's ports: MySQL, HTTP, Kafka."""
