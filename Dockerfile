# run-otel: a small, non-root image that installs the built wheel only.
#   docker build -t run-otel .
#   docker run -v $PWD/run-otel.toml:/etc/run-otel/run-otel.toml:ro run-otel

# -- build: the run-otel wheel and the wheels of its dependencies ----------------
# The C compiler compiles the pure core (setup.py, mypyc); it stays in this stage.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# -- runtime ----------------------------------------------------------------------
FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/run-otel --create-home run-otel \
    && mkdir -p /etc/run-otel
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels run-otel \
    && rm -rf /wheels
USER 10001:10001
WORKDIR /var/lib/run-otel
# Config from a mounted file. No RUN_OTEL_<SECTION>__<KEY> defaults here: an
# ENV would silently beat the same key in the mounted file. Set in the file
#   [metrics] host = "0.0.0.0"    so Prometheus can scrape the container
#   [state]   url  = "..."        the default sqlite:///run-otel-state.db lands in
#                                 the working directory, /var/lib/run-otel (a volume)
# run-otel logs a warning for each RUN_OTEL_* variable that overrides a key of the file.
ENV RUN_OTEL_CONFIG=/etc/run-otel/run-otel.toml \
    PYTHONUNBUFFERED=1
EXPOSE 9464
# `run-otel health` probes /readyz on metrics.host/metrics.port as the daemon
# reads them (file and RUN_OTEL_* variables), so the check follows a changed port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["run-otel", "health"]
ENTRYPOINT ["run-otel"]
CMD ["run"]
