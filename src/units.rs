//! Sizes and durations as people write and read them: the one leaf that the configuration,
//! the engines' messages and `ferry check` share. It imports nothing of the crate.

use std::time::Duration;

/// Largest size any setting accepts: lengths are stored as signed 64-bit integers.
const MAX_SIZE: u64 = i64::MAX as u64;

/// A byte size: plain digits or a number with a unit (`64MiB`, `1TiB`, `500MB`); 1 to 2^63-1.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let n = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>().ok()
    } else {
        s.parse::<bytesize::ByteSize>().ok().map(|b| b.as_u64())
    };
    match n {
        Some(n) if (1..=MAX_SIZE).contains(&n) => Ok(n),
        Some(_) => Err(format!("size {s:?} must be between 1 byte and 8EiB")),
        None => Err(format!("invalid size {s:?}: expected bytes like 1048576, 64MiB or 1TiB")),
    }
}

/// A duration as a person reads it in a message: `1 day`, `2 days 3 h`, `30 s`, `1 min 30 s`,
/// `250 ms` (humantime's units with a space before each, `m` spelt `min`, `days` plural).
pub fn human_duration(d: Duration) -> String {
    let text = humantime::format_duration(d).to_string();
    let words: Vec<String> = text
        .split(' ')
        .map(|part| {
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            let (n, unit) = part.split_at(digits);
            let unit = match unit {
                "days" | "day" if n == "1" => "day",
                "days" | "day" => "days",
                "m" => "min",
                "months" | "month" | "years" | "year" | "y" | "M" => unit,
                other => other,
            };
            format!("{n} {unit}")
        })
        .collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words() {
        assert_eq!(human_duration(Duration::from_secs(86_400)), "1 day");
        assert_eq!(human_duration(Duration::from_secs(2 * 86_400 + 3 * 3600)), "2 days 3 h");
        assert_eq!(human_duration(Duration::from_secs(90)), "1 min 30 s");
        assert_eq!(human_duration(Duration::from_millis(250)), "250 ms");
    }
}
