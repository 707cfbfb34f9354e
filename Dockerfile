# The worker image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY app ./app
COPY agents ./agents
COPY tables ./tables
COPY migrations ./migrations
RUN pip install --no-cache-dir .
ENV WEB_BIND=0.0.0.0 PYTHONUNBUFFERED=1
EXPOSE 6066
CMD ["faust", "-A", "app", "worker", "-l", "info"]
