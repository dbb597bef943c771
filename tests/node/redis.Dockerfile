# Test tier only (tests/node): the chart's bundled Redis, built from a Debian base with
# redis-server and redis-tools already in it (images.sh bootstraps it), so no registry is needed.
# The chart runs it as uid 999 with `sh -c 'exec redis-server - <<EOF ...'` and probes with
# redis-cli; it writes only /data and /tmp (volumes).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN redis-server --version && redis-cli --version
USER 999:999
WORKDIR /data
CMD ["redis-server"]
