//! docs/configuration.md documents every field of both rule formats: its tables are rendered
//! from the JSON Schema that `tollgate schema` prints (derived from the types the parsers
//! read), and every field the parsers accept, asked of the parsers themselves, is on the page.

use crate::reference;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{Map, Value, json};
use tollgate_server::cli::schema::rule_files;
use tollgate_server::provider;

const PAGE: &str = "configuration.md";

/// An object of the schema, where it is met first in a file, and how to write a file that
/// reaches it.
struct Section {
    /// The definition's name.
    def: String,
    /// Where it is, as a reader writes it (`rules[].tiers[]`); several for a shared definition.
    places: Vec<String>,
    /// A file with `{}` at this place: `reach(json!({"x": 1}))` puts the mapping there.
    reach: Box<dyn Fn(Value) -> Value>,
}

fn defs(schema: &Value) -> &Map<String, Value> {
    schema["$defs"].as_object().unwrap()
}

/// The definition a property's schema refers to, through `anyOf` with null and arrays.
fn referred(property: &Value) -> Option<(String, bool)> {
    if let Some(r) = property.get("$ref").and_then(Value::as_str) {
        return Some((r.trim_start_matches("#/$defs/").to_string(), false));
    }
    if let Some(items) = property.get("items") {
        return referred(items).map(|(name, _)| (name, true));
    }
    property
        .get("anyOf")
        .and_then(Value::as_array)
        .and_then(|choices| choices.iter().find_map(referred))
}

/// Puts a mapping at one place of a file.
type Reach = std::rc::Rc<dyn Fn(Value) -> Value>;

/// Every object of a file's schema, from `root`, in the order a reader meets them.
fn sections(schema: &Value, root: &str, top: Value) -> Vec<Section> {
    fn walk(
        schema: &Value,
        def: &str,
        place: String,
        reach: Reach,
        out: &mut Vec<(String, String, Reach)>,
    ) {
        if out.iter().any(|(d, _, _)| d == def) {
            if let Some(found) = out.iter_mut().find(|(d, _, _)| d == def)
                && !found.1.split(", ").any(|p| p == place)
                && !place.starts_with(&found.1)
            {
                found.1 = format!("{}, {place}", found.1);
            }
            return;
        }
        out.push((def.to_string(), place.clone(), reach.clone()));
        let Some(properties) = defs(schema)[def]["properties"].as_object() else {
            return;
        };
        for (name, property) in properties {
            let Some((inner, list)) = referred(property) else {
                continue;
            };
            if defs(schema)[&inner].get("properties").is_none() {
                continue;
            }
            let (name, reach) = (name.clone(), reach.clone());
            let child = match place.as_str() {
                "" => name.clone(),
                parent => format!("{parent}.{name}"),
            };
            let child = if list { format!("{child}[]") } else { child };
            let step: Reach = std::rc::Rc::new(move |v: Value| {
                let v = if list { json!([v]) } else { v };
                reach(json!({ name.clone(): v }))
            });
            walk(schema, &inner, child, step, out);
        }
    }
    let mut out = Vec::new();
    let top = std::rc::Rc::new(move |v: Value| {
        let mut file = top.clone();
        if let (Some(file), Some(v)) = (file.as_object_mut(), v.as_object()) {
            file.extend(v.clone());
        }
        file
    });
    walk(schema, root, String::new(), top, &mut out);
    out.into_iter()
        .map(|(def, place, reach)| Section {
            def,
            places: place.split(", ").map(String::from).collect(),
            reach: Box::new(move |v| reach(v)),
        })
        .collect()
}

/// A section's heading.
fn heading(section: &Section) -> String {
    match section.places.as_slice() {
        [top] if top.is_empty() && section.def == "EnvoyFile" => "An Envoy file".into(),
        [top] if top.is_empty() => "A native file".into(),
        places => places
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A property's type, as a reader says it.
fn type_of(schema: &Value, property: &Value) -> String {
    let duration = property["oneOf"][0]["pattern"]
        .as_str()
        .is_some_and(|p| p.contains("(ms|s|m|h|d|w)"));
    if duration {
        return "duration".into();
    }
    if let Some((def, list)) = referred(property) {
        let target = &defs(schema)[&def];
        let named = match target.get("oneOf").and_then(Value::as_array) {
            Some(choices) => {
                let values: Vec<String> = choices
                    .iter()
                    .filter_map(|c| c["const"].as_str())
                    .map(|c| format!("`{c}`"))
                    .collect();
                format!("one of {}", values.join(", "))
            }
            None => "mapping".into(),
        };
        return if list {
            format!("list of {named}")
        } else {
            named
        };
    }
    let kinds: Vec<&str> = match &property["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    match kinds.as_slice() {
        ["array"] => format!("list of {}", type_of(schema, &property["items"])),
        ["object"] => match &property["additionalProperties"] {
            Value::Object(values) => format!(
                "mapping of {}",
                type_of(schema, &Value::Object(values.clone()))
            ),
            _ => "mapping".into(),
        },
        ["integer"] => "whole number".into(),
        ["boolean"] => "true or false".into(),
        ["string"] => "text".into(),
        [] => "any".into(),
        other => other.join(" or "),
    }
}

/// The rows of one section.
fn table(schema: &Value, def: &str) -> String {
    let mut out = String::from("| field | type | default | meaning |\n| --- | --- | --- | --- |\n");
    let properties = defs(schema)[def]["properties"].as_object().unwrap();
    for (name, property) in properties {
        let mut field = format!("`{name}`");
        if let Some(aliases) = property.get("x-aliases").and_then(Value::as_array) {
            let aliases: Vec<String> = aliases
                .iter()
                .filter_map(Value::as_str)
                .map(|a| format!("`{a}`"))
                .collect();
            field.push_str(&format!(" (or {})", aliases.join(", ")));
        }
        let default = match property.get("default") {
            None | Some(Value::Null) => String::new(),
            Some(Value::Array(a)) if a.is_empty() => "none".into(),
            Some(Value::Object(o)) if o.is_empty() => "none".into(),
            Some(Value::String(s)) if s.is_empty() => "none".into(),
            Some(Value::String(s)) => format!("`{s}`"),
            Some(other) => format!("`{other}`"),
        };
        let meaning = property["description"].as_str().unwrap_or_default();
        out.push_str(&format!(
            "| {field} | {} | {default} | {} |\n",
            reference::cell(&type_of(schema, property)),
            reference::cell(meaning)
        ));
    }
    out
}

fn native_sections(schema: &Value) -> Vec<Section> {
    sections(schema, "NativeFile", json!({}))
}

fn envoy_sections(schema: &Value) -> Vec<Section> {
    sections(schema, "EnvoyFile", json!({ "domain": "probe" }))
}

fn render(schema: &Value, sections: &[Section]) -> String {
    let mut out = String::new();
    for section in sections {
        let description = defs(schema)[&section.def]["description"]
            .as_str()
            .unwrap_or_default();
        out.push_str(&format!(
            "### {}\n\n{}\n\n{}\n",
            heading(section),
            reference::cell(description),
            table(schema, &section.def)
        ));
    }
    out
}

#[test]
fn the_page_is_what_the_types_say() {
    let schema = rule_files();
    reference::check_block(PAGE, "native", &render(&schema, &native_sections(&schema)));
    reference::check_block(PAGE, "envoy", &render(&schema, &envoy_sections(&schema)));
}

/// `value` as block YAML (a rule file's format is told by its top-level keys' lines).
fn yaml(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::Object(m) if !m.is_empty() => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        yaml(v, indent + 2, out);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        yaml(v, indent + 2, out);
                    }
                    _ => out.push_str(&format!("{pad}{k}: {v}\n")),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                let mut inner = String::new();
                yaml(item, indent + 2, &mut inner);
                let inner = inner.trim_start();
                out.push_str(&format!("{pad}- {inner}"));
            }
        }
        other => out.push_str(&format!("{pad}{other}\n")),
    }
}

/// What the parsers say they expect at the place `file` puts its unknown field or value.
fn expected(file: &Value) -> Vec<String> {
    let mut text = String::new();
    yaml(file, 0, &mut text);
    let files = [(PathBuf::from("probe.yaml"), text.clone())];
    let error = match provider::load_texts(&files) {
        Ok(_) => panic!("the parsers took an unknown field:\n{text}"),
        Err(e) => e.message,
    };
    let Some((_, list)) = error.split_once("expected one of ") else {
        panic!("no list of what is expected for:\n{text}\n{error}");
    };
    list.split(", ")
        .map(|n| n.trim_matches('`').to_string())
        .collect()
}

/// The fields (and values) the page writes in the table under `heading`.
fn on_the_page(page: &str, heading: &str) -> BTreeSet<String> {
    let start = page
        .find(&format!("### {heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading} on the page"));
    let rest = &page[start + 4..];
    let section = &rest[..rest.find("\n### ").unwrap_or(rest.len())];
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        for cell in [cells[0], cells[1]] {
            for part in cell.split('`').skip(1).step_by(2) {
                names.insert(part.to_string());
            }
        }
    }
    names
}

#[test]
fn every_field_the_parsers_accept_is_on_the_page() {
    let schema = rule_files();
    let page = reference::read(PAGE);
    let mut probed = 0;
    for section in native_sections(&schema)
        .iter()
        .chain(&envoy_sections(&schema))
    {
        let written = on_the_page(&page, &heading(section));
        let accepted = expected(&(section.reach)(json!({ "zz_not_a_field": 1 })));
        let missing: Vec<_> = accepted.iter().filter(|n| !written.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "{}: the parsers accept {missing:?}, the page does not say",
            heading(section)
        );
        // Each field whose value is one of a few words: those words.
        for (name, property) in defs(&schema)[&section.def]["properties"]
            .as_object()
            .unwrap()
        {
            let Some((def, false)) = referred(property) else {
                continue;
            };
            if defs(&schema)[&def].get("oneOf").is_none() {
                continue;
            }
            let accepted = expected(&(section.reach)(json!({ name.clone(): "zz_not_a_value" })));
            let missing: Vec<_> = accepted.iter().filter(|n| !written.contains(*n)).collect();
            assert!(
                missing.is_empty(),
                "{}.{name}: the parsers accept {missing:?}, the page does not say",
                heading(section)
            );
            probed += 1;
        }
        probed += 1;
    }
    // The file, server, store, rules, match, tiers, TLS; Envoy's file, descriptors, limits,
    // replaces; and the kinds, modes and when_full's values.
    assert!(probed >= 14, "only {probed} places probed");
}
