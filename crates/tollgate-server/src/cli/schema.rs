//! `tollgate schema`: the JSON Schema of rule files, native or Envoy's, derived from the very
//! types their parsers read, for editors that complete and check YAML with it (through
//! `yaml-language-server`: `# yaml-language-server: $schema=tollgate.schema.json`).

use std::process::ExitCode;

use serde_json::{Map, Value, json};

/// The schema of a rule file: either format, each described with its fields, types,
/// defaults and meanings.
pub fn rule_files() -> Value {
    let mut defs = Map::new();
    let mut choices = Vec::new();
    let formats = [
        ("NativeFile", crate::config::native::schema()),
        ("EnvoyFile", crate::envoy::file::schema()),
    ];
    for (name, schema) in formats {
        let mut root = schema.to_value();
        if let Some(root) = root.as_object_mut() {
            root.remove("$schema");
            if let Some(Value::Object(inner)) = root.remove("$defs") {
                defs.extend(inner);
            }
        }
        defs.insert(name.to_string(), root);
        choices.push(json!({ "$ref": format!("#/$defs/{name}") }));
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tollgate rule file",
        "description": "A tollgate rule file: the native format (server, store, rules) or the Envoy ratelimit service's (domain, descriptors).",
        "anyOf": choices,
        "$defs": defs,
    })
}

/// Prints the schema of rule files on standard output.
pub(super) fn run() -> ExitCode {
    match serde_json::to_string_pretty(&rule_files()) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
