//! A route without a client in the host's mapping is refused before any
//! dispatch with `route_client_missing`, at the first such route in priority
//! order, naming every route without one.
#![cfg(feature = "lab")]
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "tests fail loudly"
)]

use retryledger_core::decode::from_value;
use retryledger_core::error::ErrorCode;
use retryledger_core::{compile, lab};

#[test]
fn every_route_needs_a_client() {
    let policy = compile(from_value(lab::reference_policy()).unwrap()).unwrap();
    let ids: Vec<String> = policy
        .routes()
        .map(|r| r.route_id.as_str().to_owned())
        .collect();
    assert!(
        ids.len() >= 2,
        "the reference policy has a primary and a fallback"
    );
    policy
        .require_clients(|id| ids.iter().any(|x| x == id))
        .unwrap();

    let e = policy.require_clients(|_| false).unwrap_err();
    assert_eq!(e.code, ErrorCode::RouteClientMissing);
    assert_eq!(e.code.as_str(), "route_client_missing");
    assert_eq!(e.code.family().as_str(), "policy");
    let first = policy
        .policy
        .routes
        .iter()
        .position(|r| r.route_id.as_str() == ids[0])
        .unwrap();
    assert_eq!(
        e.path.as_deref(),
        Some(format!("/routes/{first}/route_id").as_str())
    );
    for id in &ids {
        assert!(e.message.contains(id.as_str()), "{}", e.message);
    }

    // Only the fallback lacks one: the error points at it and names only it.
    let e = policy.require_clients(|id| id == ids[0]).unwrap_err();
    let second = policy
        .policy
        .routes
        .iter()
        .position(|r| r.route_id.as_str() == ids[1])
        .unwrap();
    assert_eq!(
        e.path.as_deref(),
        Some(format!("/routes/{second}/route_id").as_str())
    );
    assert!(
        !e.message.contains(&format!("{},", ids[0]))
            && !e.message.contains(&format!(" {}:", ids[0]))
    );
}

fn lowering_case(name: &str) -> serde_json::Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/lowering.json");
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()["input"]
        .clone()
}

/// `lower_routes` lowers the request for exactly the routes
/// `route_capabilities` finds capable, each as `lower_request` lowers it for
/// the route's release, and refuses as `build_policy` does when none is.
#[test]
fn lower_routes_lowers_each_capable_route_as_lower_request_does() {
    use retryledger_core::api;
    let input = lowering_case("routes_thinking_history_refused");
    let (request, spec) = (
        input["request"].as_str().unwrap(),
        input["spec"].as_str().unwrap(),
    );
    let report: serde_json::Value =
        serde_json::from_str(&api::route_capabilities(request, spec).unwrap()).unwrap();
    let lowered: serde_json::Value =
        serde_json::from_str(&api::lower_routes(request, spec).unwrap()).unwrap();
    let capable: Vec<&str> = report["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["capable"] == true)
        .map(|r| r["route_id"].as_str().unwrap())
        .collect();
    let got: Vec<&str> = lowered["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["route_id"].as_str().unwrap())
        .collect();
    assert!(!capable.is_empty());
    assert_eq!(got, capable);
    let spec_value: serde_json::Value = serde_json::from_str(spec).unwrap();
    for r in lowered["routes"].as_array().unwrap() {
        let route = spec_value["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["route_id"] == r["route_id"])
            .unwrap();
        let alone: serde_json::Value = serde_json::from_str(
            &api::lower_request(request, &route["release"].to_string(), "{}").unwrap(),
        )
        .unwrap();
        assert_eq!(r["lowered"], alone);
    }

    let none = lowering_case("build_thinking_history_gemini_only_refused");
    let e = api::lower_routes(
        none["request"].as_str().unwrap(),
        none["spec"].as_str().unwrap(),
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::NoCapableRoute, Some("/routes"))
    );

    // A capable route without lowering settings cannot be sent the lowered request.
    let mut bare = spec_value.clone();
    let i = bare["routes"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["route_id"] == capable[0])
        .unwrap();
    bare["routes"][i]["release"]
        .as_object_mut()
        .unwrap()
        .remove("lowering");
    let e = api::lower_routes(request, &bare.to_string()).unwrap_err();
    assert_eq!(e.code, ErrorCode::MissingField);
    assert_eq!(e.path.unwrap(), format!("/routes/{i}/release/lowering"));
}
