# Test tier only (tests/node): the pod sandbox ("pause") image, Kubernetes' own pause.c compiled
# statically on the host (images.sh) and nothing else.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
