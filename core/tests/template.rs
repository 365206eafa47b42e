//! A policy template bound per call gives exactly `build_policy`'s document
//! and digest: every `build_policy` case of the builder and preset vectors,
//! its spec's key taken out and bound instead.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use std::path::PathBuf;

use retryledger_core::api;
use retryledger_core::canonical::digest_value;
use serde_json::Value;

fn cases(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/vectors")
        .join(file);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["cases"].as_array().unwrap().clone()
}

#[test]
fn template_equals_build_policy_on_every_builder_vector() {
    let mut compared = 0;
    for file in ["builder.json", "preset.json"] {
        for case in cases(file) {
            if case["op"] != "build_policy" {
                continue;
            }
            let name = case["name"].as_str().unwrap();
            let request = case["input"]["request"].as_str().unwrap();
            let mut spec: Value =
                serde_json::from_str(case["input"]["spec"].as_str().unwrap()).unwrap();
            let Some(key) = spec
                .as_object_mut()
                .unwrap()
                .remove("idempotency_key_sha256")
            else {
                continue;
            };
            let bound = api::compile_policy_template(&spec.to_string())
                .and_then(|t| api::bind_policy_template(&t, request, key.as_str().unwrap()));
            match (&case["expect"].get("ok"), bound) {
                (Some(want), Ok(b)) => {
                    let got: Value = serde_json::from_str(&b.policy_json).unwrap();
                    assert_eq!(&&got, want, "{name}: document");
                    assert_eq!(b.policy_sha256, digest_value(want), "{name}: digest");
                    let built = api::build_policy(request, case["input"]["spec"].as_str().unwrap())
                        .unwrap();
                    assert_eq!(b.policy_json, built, "{name}: text");
                }
                (None, Err(e)) => {
                    assert_eq!(
                        e.code.as_str(),
                        case["expect"]["error"]["code"].as_str().unwrap(),
                        "{name}: code"
                    );
                }
                (want, got) => panic!("{name}: expected {want:?}, template gave {got:?}"),
            }
            compared += 1;
        }
    }
    assert!(compared >= 30, "only {compared} cases compared");
}

#[test]
fn a_template_binds_each_call_to_its_own_request_and_key() {
    let spec = r#"{"schema":"retryledger.policy_spec.v1","preset":"interactive","routes":[{"provider":"openai","model":"gpt-4.1-mini","base_url":"http://127.0.0.1:9/v1","price":{"input":400000,"output":1600000}}]}"#;
    let t = api::compile_policy_template(spec).unwrap();
    let a = r#"{"schema":"retryledger.request.v1","operation":"chat","input":["a"]}"#;
    let b = r#"{"schema":"retryledger.request.v1","operation":"chat","input":["b"]}"#;
    let k1 = "1".repeat(64);
    let k2 = "2".repeat(64);
    let x = api::bind_policy_template(&t, a, &k1).unwrap();
    let y = api::bind_policy_template(&t, b, &k1).unwrap();
    let z = api::bind_policy_template(&t, a, &k2).unwrap();
    assert_ne!(x.policy_sha256, y.policy_sha256);
    assert_ne!(x.policy_sha256, z.policy_sha256);
    assert_eq!(
        api::validate_policy(&x.policy_json).unwrap(),
        x.policy_sha256
    );
    assert_eq!(
        api::validate_policy(&z.policy_json).unwrap(),
        z.policy_sha256
    );
}
