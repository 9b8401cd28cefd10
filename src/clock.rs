//! The host clock as the catalog stores times: Unix milliseconds (a leaf module, named by every
//! layer that needs it).

use std::time::{SystemTime, UNIX_EPOCH};

/// Current Unix time in ms (0 for a clock before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
