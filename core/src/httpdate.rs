//! HTTP-date (RFC 9110 section 5.6.7): IMF-fixdate, RFC 850 and asctime forms.

/// Seconds since the Unix epoch of an HTTP-date, or `None` if it is not one.
/// `now_year` resolves RFC 850's two-digit year: a date more than 50 years in
/// the future is taken to be in the past century.
pub fn parse(value: &str, now_year: i64) -> Option<i64> {
    imf_fixdate(value)
        .or_else(|| rfc850(value, now_year))
        .or_else(|| asctime(value))
}

const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

fn digits(s: &str, n: usize) -> Option<i64> {
    if s.len() != n || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn month(s: &str) -> Option<i64> {
    MONTHS
        .iter()
        .position(|m| *m == s)
        .and_then(|i| i64::try_from(i).ok())
        .map(|i| i.saturating_add(1))
}

fn time(s: &str) -> Option<i64> {
    let mut parts = s.split(':');
    let h = digits(parts.next()?, 2)?;
    let m = digits(parts.next()?, 2)?;
    let sec = digits(parts.next()?, 2)?;
    if parts.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    h.checked_mul(3600)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(sec)
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian), after H. Hinnant.
fn days_from_civil(y: i64, m: i64, d: i64) -> Option<i64> {
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 => {
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            if leap {
                29
            } else {
                28
            }
        }
        _ => return None,
    };
    if d < 1 || d > days_in_month {
        return None;
    }
    let y = if m <= 2 { y.checked_sub(1)? } else { y };
    let era = y.checked_div_euclid(400)?;
    let yoe = y.checked_sub(era.checked_mul(400)?)?;
    let mp = if m > 2 {
        m.checked_sub(3)?
    } else {
        m.checked_add(9)?
    };
    let doy = mp
        .checked_mul(153)?
        .checked_add(2)?
        .checked_div(5)?
        .checked_add(d)?
        .checked_sub(1)?;
    let doe = yoe
        .checked_mul(365)?
        .checked_add(yoe / 4)?
        .checked_sub(yoe / 100)?
        .checked_add(doy)?;
    era.checked_mul(146_097)?
        .checked_add(doe)?
        .checked_sub(719_468)
}

fn epoch(y: i64, m: i64, d: i64, secs: i64) -> Option<i64> {
    days_from_civil(y, m, d)?
        .checked_mul(86_400)?
        .checked_add(secs)
}

/// `day, rest` at the first comma, which a space must follow.
fn day_and_rest(v: &str) -> Option<(&str, &str)> {
    let (day, rest) = v.split_once(',')?;
    Some((day, rest.strip_prefix(' ')?))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(v: &str) -> Option<i64> {
    let (day, rest) = day_and_rest(v)?;
    if !DAYS.contains(&day) {
        return None;
    }
    let p: Vec<&str> = rest.split(' ').collect();
    let [d, mon, y, t, gmt] = p.as_slice() else {
        return None;
    };
    if *gmt != "GMT" {
        return None;
    }
    epoch(digits(y, 4)?, month(mon)?, digits(d, 2)?, time(t)?)
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`
fn rfc850(v: &str, now_year: i64) -> Option<i64> {
    let (day, rest) = day_and_rest(v)?;
    if !LONG_DAYS.contains(&day) {
        return None;
    }
    let p: Vec<&str> = rest.split(' ').collect();
    let [date, t, gmt] = p.as_slice() else {
        return None;
    };
    if *gmt != "GMT" {
        return None;
    }
    let dp: Vec<&str> = date.split('-').collect();
    let [d, mon, yy] = dp.as_slice() else {
        return None;
    };
    let yy = digits(yy, 2)?;
    let century = now_year.checked_div(100)?.checked_mul(100)?;
    let mut year = century.checked_add(yy)?;
    if year > now_year.checked_add(50)? {
        year = year.checked_sub(100)?;
    }
    epoch(year, month(mon)?, digits(d, 2)?, time(t)?)
}

/// `Sun Nov  6 08:49:37 1994`
fn asctime(v: &str) -> Option<i64> {
    let day = v.get(0..3)?;
    if !DAYS.contains(&day) || v.get(3..4)? != " " {
        return None;
    }
    let mon = v.get(4..7)?;
    if v.get(7..8)? != " " {
        return None;
    }
    let d = v.get(8..10)?;
    let d = match d.strip_prefix(' ') {
        Some(one) => digits(one, 1)?,
        None => digits(d, 2)?,
    };
    if v.get(10..11)? != " " || v.get(19..20)? != " " || v.len() != 24 {
        return None;
    }
    epoch(
        digits(v.get(20..24)?, 4)?,
        month(mon)?,
        d,
        time(v.get(11..19)?)?,
    )
}

/// Unix milliseconds of an RFC 3339 date-time (`2026-12-03T16:05:46Z`,
/// `2026-12-03T16:05:46.250+01:00`); a fraction below the millisecond rounds
/// up. `None` if it is not one.
pub fn rfc3339_ms(value: &str) -> Option<i64> {
    let v = value.as_bytes();
    if v.len() < 20 || v.len() > 40 || !value.is_ascii() {
        return None;
    }
    let date = value.get(..10)?;
    let sep = *v.get(10)?;
    if sep != b'T' && sep != b't' {
        return None;
    }
    let y = digits(date.get(..4)?, 4)?;
    let m = digits(date.get(5..7)?, 2)?;
    let d = digits(date.get(8..10)?, 2)?;
    if date.get(4..5)? != "-" || date.get(7..8)? != "-" {
        return None;
    }
    let secs = time(value.get(11..19)?)?;
    let mut rest = value.get(19..)?;
    let mut frac_ms = 0i64;
    if let Some(after) = rest.strip_prefix('.') {
        let n = after.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return None;
        }
        let frac = after.get(..n)?;
        let head = frac.get(..n.min(3))?;
        let scale = match head.len() {
            1 => 100,
            2 => 10,
            _ => 1,
        };
        let mut ms = head.parse::<i64>().ok()?.checked_mul(scale)?;
        if frac.bytes().skip(3).any(|b| b != b'0') {
            ms = ms.checked_add(1)?;
        }
        frac_ms = ms;
        rest = after.get(n..)?;
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let negative = match rest.get(..1)? {
                "+" => false,
                "-" => true,
                _ => return None,
            };
            if rest.len() != 6 || rest.get(3..4)? != ":" {
                return None;
            }
            let h = digits(rest.get(1..3)?, 2)?;
            let mi = digits(rest.get(4..6)?, 2)?;
            if h > 23 || mi > 59 {
                return None;
            }
            let off = h.checked_mul(3600)?.checked_add(mi.checked_mul(60)?)?;
            if negative {
                off.checked_neg()?
            } else {
                off
            }
        }
    };
    epoch(y, m, d, secs)?
        .checked_sub(offset)?
        .checked_mul(1000)?
        .checked_add(frac_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_forms_agree() {
        let want = Some(784_111_777);
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT", 2026), want);
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:37 GMT", 2026), want);
        assert_eq!(parse("Sun Nov  6 08:49:37 1994", 2026), want);
    }

    #[test]
    fn rejects_garbage() {
        for v in [
            "",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 31 Feb 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun Nov 6 08:49:37 1994",
            "06 Nov 1994",
        ] {
            assert_eq!(parse(v, 2026), None, "{v}");
        }
    }

    #[test]
    fn epoch_and_leap_days() {
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
        assert_eq!(days_from_civil(2000, 2, 29), Some(11_016));
        assert_eq!(days_from_civil(1900, 2, 29), None);
    }
}
