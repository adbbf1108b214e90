# postrelay: one image for `postrelay migrate`, `relay`, `worker`, `api` and the operator commands.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The wheel build copies migrations/ into the package, so an installed postrelay can migrate.
COPY pyproject.toml README.md alembic.ini ./
COPY migrations ./migrations
COPY postrelay ./postrelay
RUN pip install . && rm -rf /src

RUN useradd --create-home --uid 10001 postrelay
USER postrelay
WORKDIR /home/postrelay
# The demo's email templates where POSTRELAY_EMAIL_TEMPLATES_DIR (default `templates`) looks;
# mount your own folder over it.
COPY --chown=postrelay postrelay/demo/templates ./templates

# Exec form: the process is PID 1 and receives SIGTERM itself (graceful hand-back).
ENTRYPOINT ["postrelay"]
CMD ["--help"]
