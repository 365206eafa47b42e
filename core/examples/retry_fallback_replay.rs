//! The replay lab: runs the reference run and every mutation case, prints the
//! summary and the case table, and writes the report to
//! `target/labs/retry-fallback/<policy-sha256>.json`.

use std::path::PathBuf;
use std::process::ExitCode;

use retryledger_core::lab;

fn main() -> ExitCode {
    let report = match lab::run() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lab failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (bytes, _) = lab::report_bytes(&report);
    let policy = report
        .get("policy_sha256")
        .and_then(|v| v.as_str())
        .unwrap_or("unknown");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
        .join("labs")
        .join("retry-fallback");
    let path = dir.join(format!("{policy}.json"));
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, bytes.as_bytes()))
    {
        eprintln!("cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    if std::env::args().any(|a| a == "--cases") {
        print!("{}", lab::case_table(&report));
        println!();
    }
    print!("{}", lab::summary(&report));
    println!("report written to {}", path.display());
    let all = report.get("passed") == report.get("total");
    if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
