# tollgate's image: the service, its example rules and CA certificates on a distroless base,
# run as a user without privileges (nonroot, 65532), with no shell.
#
#   docker build -t tollgate .
#   docker run -p 8080:8080 -p 8081:8081 tollgate
#
# It serves /etc/tollgate/rules (the multi-tenant example); mount a rule file or directory
# there to serve yours (`-v $PWD/rules:/etc/tollgate/rules:ro`). Other commands:
# `docker run --entrypoint tollgate tollgate validate /etc/tollgate/rules`. As /bin/ratelimit,
# where Envoy Gateway starts envoyproxy/ratelimit, it serves as that service would, from its
# settings (docs/envoy.md). scripts/image builds it where no registry can be reached.
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
# Names the build stage's image, which scripts/image removes once the image is built.
LABEL tollgate.stage=build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tollgate-server --bin tollgate \
 && mkdir -p /out/usr/local/bin /out/bin /out/etc/tollgate/rules /out/usr/share/tollgate \
 && cp target/release/tollgate /out/usr/local/bin/tollgate \
 && ln -s /usr/local/bin/tollgate /out/bin/ratelimit \
 && cp examples/multi-tenant.yaml /out/etc/tollgate/rules/ \
 && cp -r examples /out/usr/share/tollgate/examples \
 && rm -rf /out/usr/share/tollgate/examples/llm-proxy

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/ /
USER 65532:65532
# Listeners on every address: 8080 HTTP (checks, admin, console, /metrics, health), 8081 gRPC
# (Envoy's rate limit service). PORT and GRPC_PORT are the Envoy service's settings, for a
# start without arguments or rule files (as /bin/ratelimit, or over xDS).
ENV PORT=8080 GRPC_PORT=8081
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/tollgate", "serve"]
CMD ["--config", "/etc/tollgate/rules", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081"]
