//! docs/HOSTS.md prints the classifier's tables; it must list every entry.
#![allow(clippy::unwrap_used, clippy::panic, reason = "tests fail loudly")]

use retryledger_core::observe::{Meaning, Rule, ERROR_CODES, ERROR_TYPES};

#[test]
fn the_host_contract_page_lists_every_table_entry_and_rule() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/HOSTS.md")).unwrap();
    for (name, meaning) in ERROR_TYPES.iter().chain(ERROR_CODES) {
        let said = match meaning {
            Meaning::Signal(s) => format!("signal `{}`", s.as_str()),
            Meaning::Outcome(o) => format!("outcome `{}/{}`", o.class().as_str(), o.kind_name()),
        };
        let row = format!("| `{name}` | {said} |");
        assert!(page.contains(&row), "docs/HOSTS.md lacks the row {row}");
    }
    for rule in Rule::NAMES {
        assert!(
            page.contains(&format!("| `{rule}` |")),
            "docs/HOSTS.md lacks rule {rule}"
        );
    }
}
