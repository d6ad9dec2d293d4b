//! Every input the fuzz targets (`fuzz/`) found to break something, and a few seeds, kept
//! as regressions: each goes through the very checks its target runs (`harness`). The
//! inputs are files under `tests/fuzzed/<target>/`.

use crate::harness;

use std::path::Path;

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzzed")
        .join(target);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name, std::fs::read(e.path()).unwrap())
                })
                .collect()
        })
        .unwrap_or_default();
    inputs.sort();
    inputs
}

macro_rules! regressions {
    ($($target:ident),* $(,)?) => {$(
        #[test]
        fn $target() {
            for (name, input) in inputs(stringify!($target)) {
                let outcome = std::panic::catch_unwind(|| harness::$target(&input));
                assert!(outcome.is_ok(), "{}: {name}", stringify!($target));
            }
        }
    )*};
}

regressions!(
    native_config,
    envoy_config,
    check_body,
    auth,
    rls_request,
    path_pattern
);
