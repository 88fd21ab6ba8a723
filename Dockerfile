# The Argus image: stream workers (`argus worker`), the sink (`argus sink`), the node agent
# (`argus node-agent`), the simulator (`argus simulate`) and every other `argus` command.
# The rank agent runs inside the training job's own image (`pip install "argus-gpu[agent,torch]"`).
#
#   docker build -t argus:0.1.0 .        # the tag is pyproject's version (`make version-sync`)
#
# Stage 1 builds the wheel (what PyPI users install); stage 2 installs only that wheel.
# `.ci/run` (.ci/wheel-check) builds the same wheel and resolves the same install line.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY argus ./argus
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ARGUS_HOME=/var/lib/argus
COPY --from=build /wheels /wheels
# ARGUS_IMAGE_EXTRAS: the extras the image installs (.ci/wheel-check reads this line)
RUN pip install "$(ls /wheels/argus_gpu-*.whl)[agent,cli,nvml,detect,streams,sinks]" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /var/lib/argus --create-home argus

USER 10001
# Prometheus /metrics of `argus worker --metrics-port 9464`, `argus sink --metrics-port 9465`
# and `argus node-agent --metrics-port 9466`
EXPOSE 9464 9465 9466
VOLUME ["/var/lib/argus"]
ENTRYPOINT ["argus"]
CMD ["doctor"]
