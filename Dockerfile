# The images docker-compose.yml uses: the worker's (the last stage, what `docker build .` builds)
# and the demo's fake providers (`--target fakes`: the worker's image with demo/, which the wheel
# and the worker's image do not ship).
FROM python:3.11-slim AS base
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY app ./app
COPY agents ./agents
COPY tables ./tables
COPY migrations ./migrations
RUN pip install --no-cache-dir .
ENV WEB_BIND=0.0.0.0 PYTHONUNBUFFERED=1

FROM base AS fakes
COPY demo ./demo
EXPOSE 8900
CMD ["python", "-m", "demo.fakes", "--host", "0.0.0.0", "--port", "8900"]

FROM base AS worker
EXPOSE 6066
CMD ["faust", "-A", "app", "worker", "-l", "info"]
