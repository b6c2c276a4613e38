# Two images from one tree (docker-compose.yml builds both):
#   --target api     the API + panel, the scheduler and the migrations: no torch, no transformers
#   --target runner  the GPU host's runner: torch and transformers (CUDA wheels from PyPI)
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin scrinalia
COPY pyproject.toml setup.py MANIFEST.in README.md alembic.ini ./
COPY scrinalia ./scrinalia
COPY runner ./runner
# Installed as scrinalia._migrations, scrinalia._ui, scrinalia._systemd (setup.py): all three must be here.
COPY migrations ./migrations
COPY ui ./ui
COPY systemd ./systemd

FROM base AS api
RUN pip install '.[api]'
USER scrinalia
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --retries=4 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"
CMD ["scrinalia", "api", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]

FROM base AS runner
RUN pip install '.[runner]'
USER scrinalia
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
CMD ["scrinalia-runner", "daemon", "--name", "runner", "--concurrency", "1"]
