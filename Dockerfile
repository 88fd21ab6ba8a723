# The Argus image: stream workers (`argus worker`), the sink (`argus sink`), the node agent
# (`argus node-agent`), the simulator (`argus simulate`) and every other `argus` command.
# The rank agent runs inside the training job's own image (`pip install "argus-gpu[agent,torch]"`).
#
#   docker build -t argus:0.1.0 .
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ARGUS_HOME=/var/lib/argus

WORKDIR /opt/argus
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY producers ./producers
COPY detectors ./detectors
COPY streams ./streams
COPY sinks ./sinks
COPY argus ./argus
RUN pip install ".[agent,cli,nvml,detect,streams,sinks]" \
    && useradd --system --uid 10001 --home-dir /var/lib/argus --create-home argus

USER 10001
# Prometheus /metrics of `argus worker --metrics-port 9464` and `argus sink --metrics-port 9465`
EXPOSE 9464 9465
VOLUME ["/var/lib/argus"]
ENTRYPOINT ["argus"]
CMD ["doctor"]
