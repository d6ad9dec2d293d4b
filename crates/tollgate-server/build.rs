//! Compiles the protocol definitions of `proto/` that no crate ships generated: the
//! `RateLimitConfig` resource of envoyproxy/ratelimit's xDS configuration (see
//! `proto/README.md`). protox parses them, so no `protoc` is needed; the well-known types they
//! use are envoy-types', as in the rest of the service.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ratelimit/config/ratelimit/v3/rls_conf.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new()
        // Not prost-types' well-known types, which prost-build would otherwise name.
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_fds(descriptors)?;
    Ok(())
}
