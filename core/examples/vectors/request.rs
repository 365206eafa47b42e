//! `request.json`: the logical request's canonical form (full RFC 8785,
//! floats included) and digest, and scoped idempotency key digests.

use serde_json::json;

use crate::family::Family;

fn request(input: &str) -> String {
    format!(r#"{{"schema":"retryledger.request.v1","operation":"chat","input":{input}}}"#)
}

pub fn family() -> Family {
    let mut f = Family::new(
        "request",
        "canonical_request / request_sha256: the logical request in full RFC 8785 form (ECMAScript numbers) and its digest; idempotency_key_sha256: bare and scoped key digests.",
        "number edge cases (1e21, 1e20, 5e-324, -0, 0.1+0.2, 2^53-1, 2^53+1, 1E2, 1.0, 1e-7, the largest double), nulls, strings needing escapes and non-BMP characters, key order by UTF-16 code units, nested tools and sampling, formatting that does not change the digest; errors for NaN, Infinity, 1e400, lone surrogates, duplicate keys, unknown and missing fields, a fractional seed, a bad operation; bare and scoped idempotency keys and a half-scoped key",
    );
    let numbers = [
        ("1e21", "[1e21]"),
        ("1e20", "[1e20]"),
        ("min_subnormal", "[5e-324]"),
        ("negative_zero", "[-0]"),
        ("point_one_plus_point_two", "[0.30000000000000004]"),
        ("two_53_minus_1", "[9007199254740991]"),
        ("two_53_plus_1", "[9007199254740993]"),
        ("exponent_upper", "[1E2]"),
        ("one_point_zero", "[1.0]"),
        ("small", "[1e-7, 0.000001]"),
        ("largest_double", "[1.7976931348623157e308]"),
        ("negative", "[-1.5, -100, -1e-10]"),
        (
            "rfc8785_sample_numbers",
            "[333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]",
        ),
    ];
    for (name, input) in numbers {
        let text = request(input);
        f.add(
            &format!("request_numbers_{name}"),
            "canonical_request",
            vec![("request", json!(text))],
            "ok",
        );
        f.add(
            &format!("request_sha256_numbers_{name}"),
            "request_sha256",
            vec![("request", json!(text))],
            "ok",
        );
    }
    let full = r#"{
      "schema": "retryledger.request.v1", "operation": "chat.completions",
      "input": [{"role": "system", "content": "Be brief.\n\t\"quoted\" \u00e9 😀"},
                {"role": "user", "content": "Weather in Zürich?", "name": null}],
      "tools": [{"type": "function", "function": {"name": "weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
      "output_contract": {"type": "json_schema", "strict": true},
      "sampling": {"temperature": 0.2, "top_p": 1.0, "max_tokens": 256},
      "seed": 42,
      "modalities": {"input": ["text"], "output": ["text"]}
    }"#;
    f.add(
        "request_full_chat",
        "canonical_request",
        vec![("request", json!(full))],
        "ok",
    );
    f.add(
        "request_sha256_full_chat",
        "request_sha256",
        vec![("request", json!(full))],
        "ok",
    );
    f.add(
        "request_key_order_utf16",
        "canonical_request",
        vec![(
            "request",
            json!(request(
                r#"{"\u20ac":1,"\r":2,"\ud83d\ude00":3,"1":4,"\u0080":5,"a":6}"#
            )),
        )],
        "ok",
    );
    for (name, text, want) in [
        ("nan", request("[NaN]"), "invalid_json"),
        ("infinity", request("[Infinity]"), "invalid_json"),
        ("overflow", request("[1e400]"), "invalid_json"),
        ("lone_surrogate", request(r#"["\ud800"]"#), "invalid_json"),
        (
            "duplicate_key",
            request(r#"{"a":1,"a":2}"#),
            "duplicate_key",
        ),
        (
            "unknown_field",
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":1,"model":"gpt"}"#
                .to_owned(),
            "unknown_field",
        ),
        (
            "missing_input",
            r#"{"schema":"retryledger.request.v1","operation":"chat"}"#.to_owned(),
            "missing_field",
        ),
        (
            "fractional_seed",
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":1,"seed":1.5}"#
                .to_owned(),
            "invalid_value",
        ),
        (
            "empty_operation",
            r#"{"schema":"retryledger.request.v1","operation":"","input":1}"#.to_owned(),
            "invalid_identifier",
        ),
        (
            "other_schema",
            r#"{"schema":"retryledger.policy.v1","operation":"chat","input":1}"#.to_owned(),
            "schema_mismatch",
        ),
        ("not_an_object", "[1]".to_owned(), "invalid_type"),
        (
            "sampling_not_an_object",
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":1,"sampling":[]}"#
                .to_owned(),
            "invalid_type",
        ),
    ] {
        f.add(
            &format!("request_error_{name}"),
            "request_sha256",
            vec![("request", json!(text))],
            want,
        );
    }
    f.digest("request_digest_through_digest", full, "ok");
    for (name, key, tenant, operation, want) in [
        ("bare", "order-1234", None, None, "ok"),
        ("scoped", "order-1234", Some("tenant-a"), Some("chat"), "ok"),
        (
            "scoped_other_tenant",
            "order-1234",
            Some("tenant-b"),
            Some("chat"),
            "ok",
        ),
        ("scoped_unicode", "ключ-😀", Some("t"), Some("op"), "ok"),
        (
            "half_scoped",
            "order-1234",
            Some("tenant-a"),
            None,
            "invalid_value",
        ),
    ] {
        let mut input = vec![("key", json!(key))];
        if let Some(t) = tenant {
            input.push(("tenant", json!(t)));
        }
        if let Some(o) = operation {
            input.push(("operation", json!(o)));
        }
        f.add(
            &format!("idempotency_key_{name}"),
            "idempotency_key_sha256",
            input,
            want,
        );
    }
    f
}
