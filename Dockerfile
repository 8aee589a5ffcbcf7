# Logbus broker image: `docker build -t logbus .` then
#   docker run -p 127.0.0.1:8080:8080 -v logbus-data:/data logbus
# The image runs `logbus serve`; other `logbus` subcommands work too, e.g.
#   docker run --rm --network host logbus topics list

# Build stage: a wheel of Logbus from the repository, with its C record walk
# (core_log._recordscan and core_log._recordjson, see setup.py: a failed build is an error)
# compiled; the runtime image needs no compiler.
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The Spark click-stream job of docker-compose.yml (`docker build --target spark`): Logbus with
# the `spark` extra, Java 17 (bookworm's; PySpark 4 runs on 17 or 21) and examples/ in /app.
# Not the default target: the broker image below stays free of Java and Spark (~1 GB).
FROM python:3.11-slim-bookworm AS spark
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install "$(echo /wheels/*.whl)[spark]" && rm -rf /wheels
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /app logbus \
    && mkdir -p /out \
    && chown logbus:logbus /out
COPY --chown=logbus:logbus examples /app/examples
USER logbus
WORKDIR /app
VOLUME /out
CMD ["python", "-m", "examples.clickstream.pipeline", "--help"]

# The broker image (the default target).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# pip installs the wheel and its dependencies (all have manylinux wheels for CPython 3.11).
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels

# An unprivileged user that owns the data directory.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /data logbus \
    && mkdir -p /data \
    && chown logbus:logbus /data
USER logbus
WORKDIR /data
VOLUME /data
EXPOSE 8080

# Healthy = ready: GET /readyz answers 200 once the metadata store and the logs are open.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["logbus"]
# --insecure: in a container the broker must bind 0.0.0.0 to be reachable through the published
# port, and `logbus serve` refuses a non-loopback bind without --insecure because authentication
# is not implemented yet. Until it is, publish the port on a trusted interface only (the compose
# file publishes it on the host's 127.0.0.1).
CMD ["serve", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8080", "--insecure"]
