//! Output checks: an answer that arrived (HTTP 200) and is wrong, judged by
//! one table.
//!
//! The commonest failure of a model call is not a 5xx but an answer that is
//! empty, cut at the token limit, refused, or not the JSON (or the schema)
//! that was asked for. The host runs the checks (the built-in ones of its
//! integrations, and the user's own validators: pydantic, JSON Schema, zod or
//! a plain function) and passes each verdict as facts ([`OutputCheck`]: the
//! check's kind, the validator's id, `pass` or `defects`); the core judges
//! them by [`OUTPUT_CHECKS`]: the first failed check in that order decides.
//! A refusal is `policy_denied`: non-retryable and never a fallback (another
//! route that answers what one route refused is policy shopping). Every other
//! failed check is `invalid_output`: not a transport retry, but the start of
//! a bounded repair ([`crate::repair`]). The attempt records only the
//! verdict ([`OutputCheckRecord`]: kind, validator, defect count and the
//! SHA-256 of the defects' canonical JSON), never the defects themselves.

use serde_json::Value;

use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{decode_array, names, object, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;
use crate::outcome::{NonRetryableKind, Outcome};

/// Checks one attempt may carry.
pub const MAX_OUTPUT_CHECKS: usize = 8;
/// Defects one check may report.
pub const MAX_DEFECTS: usize = 64;
/// Bytes of a defect's message.
pub const MAX_DEFECT_MESSAGE_BYTES: usize = 1024;
/// Bytes of a defect's path.
pub const MAX_DEFECT_PATH_BYTES: usize = 256;
/// Bytes of a validator id.
pub const MAX_VALIDATOR_BYTES: usize = 128;

/// What a check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// The model refused (`message.refusal`, `stop_reason: "refusal"`).
    Refusal,
    /// The answer was cut at the token limit (`finish_reason: "length"`,
    /// `stop_reason: "max_tokens"`).
    Truncated,
    /// The answer has no content.
    Empty,
    /// A JSON output contract was asked for and the answer does not parse.
    UnparsableJson,
    /// The user's validator (a schema, a model, a function).
    Schema,
}

names!(CheckKind {
    Refusal => "refusal",
    Truncated => "truncated",
    Empty => "empty",
    UnparsableJson => "unparsable_json",
    Schema => "schema",
});

const INVALID_OUTPUT: Outcome = Outcome::NonRetryable {
    kind: NonRetryableKind::InvalidOutput,
};

/// The outcome of each failed check, in precedence order: of the checks an
/// attempt failed, the first in this table decides. A refusal first: it
/// stops whatever else is wrong with the answer.
pub const OUTPUT_CHECKS: &[(CheckKind, Outcome)] = &[
    (
        CheckKind::Refusal,
        Outcome::NonRetryable {
            kind: NonRetryableKind::PolicyDenied,
        },
    ),
    (CheckKind::Truncated, INVALID_OUTPUT),
    (CheckKind::Empty, INVALID_OUTPUT),
    (CheckKind::UnparsableJson, INVALID_OUTPUT),
    (CheckKind::Schema, INVALID_OUTPUT),
];

/// The outcome a failed check of `kind` stands for.
pub fn outcome_of(kind: CheckKind) -> Outcome {
    OUTPUT_CHECKS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(INVALID_OUTPUT, |(_, o)| *o)
}

fn rank(kind: CheckKind) -> usize {
    OUTPUT_CHECKS
        .iter()
        .position(|(k, _)| *k == kind)
        .unwrap_or(OUTPUT_CHECKS.len())
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The answer passed.
    Pass,
    /// The answer failed, with at least one defect.
    Defects,
}

names!(Verdict {
    Pass => "pass",
    Defects => "defects",
});

/// One defect a validator found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defect {
    /// What is wrong (at most [`MAX_DEFECT_MESSAGE_BYTES`]).
    pub message: String,
    /// Where (a JSON Pointer or the validator's own path form; at most
    /// [`MAX_DEFECT_PATH_BYTES`]).
    pub path: Option<String>,
}

fn bounded(s: &str, max: usize, at: &At<'_>, what: &str) -> Result<()> {
    if s.len() > max {
        return Err(at.error(
            ErrorCode::OutputDefectsOverBound,
            format!("{what} is {} bytes; the limit is {max}", s.len()),
        ));
    }
    Ok(())
}

impl Decode for Defect {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let message: Option<String> = f.req("message");
        let path: Option<String> = f.opt("path");
        f.end()?;
        let Some(message) = message else {
            return Err(f.incomplete());
        };
        bounded(
            &message,
            MAX_DEFECT_MESSAGE_BYTES,
            &At::Key(at, "message"),
            "a defect's message",
        )?;
        if let Some(p) = &path {
            bounded(
                p,
                MAX_DEFECT_PATH_BYTES,
                &At::Key(at, "path"),
                "a defect's path",
            )?;
        }
        Ok(Self { message, path })
    }
}

impl Encode for Defect {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.str("message", &self.message);
        if let Some(p) = &self.path {
            o.str("path", p);
        }
        o.end();
    }
}

/// One check's verdict, as the host passes it in the facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputCheck {
    /// The defects (none for `pass`, 1..=[`MAX_DEFECTS`] for `defects`).
    pub defects: Vec<Defect>,
    /// What the check looks at.
    pub kind: CheckKind,
    /// The validator's id (1..=[`MAX_VALIDATOR_BYTES`] bytes): a built-in
    /// check's name, or the id the user gave a validator.
    pub validator: String,
    /// Pass or defects.
    pub verdict: Verdict,
}

fn not_a_verdict(at: &At<'_>, message: impl Into<String>) -> Error {
    at.error(ErrorCode::OutputVerdictInvalid, message)
}

fn named<T: Copy>(
    v: Option<&Value>,
    at: &At<'_>,
    names: &[&str],
    all: &[T],
    what: &str,
) -> Result<Option<T>> {
    let Some(v) = v else { return Ok(None) };
    let Value::String(s) = v else {
        return Err(not_a_verdict(at, format!("{what} is not a string")));
    };
    names
        .iter()
        .position(|n| n == s)
        .and_then(|i| all.get(i).copied())
        .map(Some)
        .ok_or_else(|| {
            not_a_verdict(
                at,
                format!("{what} {s:?} is not one of {}", names.join(", ")),
            )
        })
}

impl Decode for OutputCheck {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let Value::Object(map) = v else {
            return Err(not_a_verdict(
                at,
                "an output check is an object {kind, validator, verdict, defects?}",
            ));
        };
        let mut f = Fields::open(v, at)?;
        let raw_defects: Option<&Value> = map.get("defects");
        // Fields in key order (each read once): the values are judged below.
        let _ = f.opt_with("defects", |_, _| Ok(()));
        let _ = f.opt_with("kind", |_, _| Ok(()));
        let validator: Option<String> = f.opt("validator");
        let _ = f.opt_with("verdict", |_, _| Ok(()));
        f.end()?;
        let kind = named(
            map.get("kind"),
            &At::Key(at, "kind"),
            CheckKind::NAMES,
            CheckKind::ALL,
            "kind",
        )?;
        let verdict = named(
            map.get("verdict"),
            &At::Key(at, "verdict"),
            Verdict::NAMES,
            Verdict::ALL,
            "verdict",
        )?;
        let (Some(kind), Some(verdict), Some(validator)) = (kind, verdict, validator) else {
            return Err(not_a_verdict(
                at,
                "an output check needs kind, validator and verdict",
            ));
        };
        let vat = At::Key(at, "validator");
        if validator.is_empty() || validator.len() > MAX_VALIDATOR_BYTES {
            return Err(vat.error(
                ErrorCode::OutputVerdictInvalid,
                format!("a validator id is 1..={MAX_VALIDATOR_BYTES} bytes"),
            ));
        }
        let dat = At::Key(at, "defects");
        let defects = match raw_defects {
            None => Vec::new(),
            Some(d) => {
                let items = decode_array(d, &dat)?;
                if items.len() > MAX_DEFECTS {
                    return Err(dat.error(
                        ErrorCode::OutputDefectsOverBound,
                        format!("{} defects; the limit is {MAX_DEFECTS}", items.len()),
                    ));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| Defect::decode(item, &At::Index(&dat, i)))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        match (verdict, defects.is_empty()) {
            (Verdict::Pass, false) => Err(dat.error(
                ErrorCode::OutputVerdictInvalid,
                "a passing check has no defects",
            )),
            (Verdict::Defects, true) => Err(dat.error(
                ErrorCode::OutputVerdictInvalid,
                "a failed check names at least one defect",
            )),
            _ => Ok(Self {
                defects,
                kind,
                validator,
                verdict,
            }),
        }
    }
}

impl Encode for OutputCheck {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        if !self.defects.is_empty() {
            o.list("defects", &self.defects);
        }
        o.doc("kind", &self.kind);
        o.str("validator", &self.validator);
        o.doc("verdict", &self.verdict);
        o.end();
    }
}

/// What an attempt records of the check that decided its outcome: never
/// the defects, only how many and their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputCheckRecord {
    /// How many defects the check reported.
    pub defect_count: u64,
    /// SHA-256 of the defects' canonical JSON (a list).
    pub defects_sha256: Sha256Hex,
    /// What the check looked at.
    pub kind: CheckKind,
    /// The validator's id.
    pub validator: String,
}

object!(OutputCheckRecord {
    defect_count: u64,
    defects_sha256: doc,
    kind: doc,
    validator: doc,
});

struct DefectList<'a>(&'a [Defect]);

impl Encode for DefectList<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        crate::canonical::encode_list(self.0.iter(), sink);
    }
}

/// The SHA-256 of a list of defects' canonical JSON.
pub fn defects_sha256(defects: &[Defect]) -> Sha256Hex {
    Sha256Hex::computed(digest_of(&DefectList(defects)))
}

/// The failed check that decides (the first by [`OUTPUT_CHECKS`]), its
/// outcome and what the attempt records; `None` when every check passed.
pub fn judge_checks(checks: &[OutputCheck]) -> Option<(Outcome, OutputCheckRecord)> {
    let failed = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Defects)
        .min_by_key(|c| rank(c.kind))?;
    Some((
        outcome_of(failed.kind),
        OutputCheckRecord {
            defect_count: u64::try_from(failed.defects.len()).unwrap_or(u64::MAX),
            defects_sha256: defects_sha256(&failed.defects),
            kind: failed.kind,
            validator: failed.validator.clone(),
        },
    ))
}

/// Decode a facts' `output_checks` list (at most [`MAX_OUTPUT_CHECKS`]).
pub(crate) fn decode_checks(v: &Value, at: &At<'_>) -> Result<Vec<OutputCheck>> {
    let items = decode_array(v, at)?;
    if items.len() > MAX_OUTPUT_CHECKS {
        return Err(at.error(
            ErrorCode::OutputDefectsOverBound,
            format!(
                "{} output checks; the limit is {MAX_OUTPUT_CHECKS}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| OutputCheck::decode(item, &At::Index(at, i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::parse_strict;

    fn check(text: &str) -> Result<OutputCheck> {
        let v = parse_strict(text)?;
        OutputCheck::decode(&v, &At::Root)
    }

    #[test]
    fn refusal_wins_over_every_other_failed_check() {
        let fail = |kind| OutputCheck {
            defects: vec![Defect {
                message: "x".into(),
                path: None,
            }],
            kind,
            validator: "v".into(),
            verdict: Verdict::Defects,
        };
        let (o, r) = judge_checks(&[fail(CheckKind::Schema), fail(CheckKind::Refusal)]).unwrap();
        assert_eq!(
            o,
            Outcome::NonRetryable {
                kind: NonRetryableKind::PolicyDenied
            }
        );
        assert_eq!(r.kind, CheckKind::Refusal);
        let (o, _) = judge_checks(&[fail(CheckKind::Empty)]).unwrap();
        assert_eq!(o, INVALID_OUTPUT);
        assert!(judge_checks(&[]).is_none());
    }

    #[test]
    fn a_verdict_that_is_not_one_is_a_coded_error() {
        let code = |t: &str| check(t).unwrap_err().code;
        assert_eq!(
            code(r#"{"kind":"schema","validator":"v","verdict":"maybe"}"#),
            ErrorCode::OutputVerdictInvalid
        );
        assert_eq!(
            code(r#"{"kind":"vibes","validator":"v","verdict":"pass"}"#),
            ErrorCode::OutputVerdictInvalid
        );
        assert_eq!(
            code(r#"{"kind":"schema","validator":"v","verdict":"defects"}"#),
            ErrorCode::OutputVerdictInvalid
        );
        assert_eq!(
            code(
                r#"{"defects":[{"message":"m"}],"kind":"schema","validator":"v","verdict":"pass"}"#
            ),
            ErrorCode::OutputVerdictInvalid
        );
        assert_eq!(
            code(r#"{"kind":"schema","validator":"","verdict":"pass"}"#),
            ErrorCode::OutputVerdictInvalid
        );
        assert_eq!(code("true"), ErrorCode::OutputVerdictInvalid);
        let many = format!(
            r#"{{"defects":[{}],"kind":"schema","validator":"v","verdict":"defects"}}"#,
            vec![r#"{"message":"m"}"#; MAX_DEFECTS + 1].join(",")
        );
        assert_eq!(code(&many), ErrorCode::OutputDefectsOverBound);
        let long = format!(
            r#"{{"defects":[{{"message":"{}"}}],"kind":"schema","validator":"v","verdict":"defects"}}"#,
            "m".repeat(MAX_DEFECT_MESSAGE_BYTES + 1)
        );
        assert_eq!(code(&long), ErrorCode::OutputDefectsOverBound);
    }
}
