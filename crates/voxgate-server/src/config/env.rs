//! What every section's `apply_env` and `mask_secrets` share: reading one `VOXGATE_*`
//! variable into one setting, with the variable's name in every [`ConfigError::Env`], and
//! masking secrets for `--print-config`.
//!
//! Accepted spellings (all values are trimmed first, except raw strings):
//! - numbers and other [`FromStr`] values: whatever `FromStr` takes; error `"{value:?}: {e}"`.
//! - booleans: `1 true yes on` and `0 false no off`, any case.
//! - lists: comma-separated, entries trimmed, empty entries dropped.

use std::fmt::Display;
use std::str::FromStr;

use crate::config::ConfigError;

/// The environment as the sections see it: a lookup by name, so tests need not touch the
/// process environment.
#[derive(Clone, Copy)]
pub(crate) struct EnvVars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl<'a> EnvVars<'a> {
    /// Wraps a lookup (`|k| std::env::var(k).ok()` for the real environment).
    pub(crate) fn new(var: &'a impl Fn(&str) -> Option<String>) -> Self {
        Self(var)
    }

    /// The raw value of `name`, if set.
    pub(crate) fn raw(&self, name: &str) -> Option<String> {
        (self.0)(name)
    }

    /// `name` parsed with [`FromStr`], `None` when unset.
    pub(crate) fn get<T: FromStr<Err: Display>>(
        &self,
        name: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.raw(name).map(|v| parse(name, &v)).transpose()
    }

    /// Sets `into` to `name` parsed with [`FromStr`] (a number, an address, an enum), when set.
    pub(crate) fn parsed<T: FromStr<Err: Display>>(
        &self,
        name: &'static str,
        into: &mut T,
    ) -> Result<(), ConfigError> {
        self.parsed_as(name, into, |v| v)
    }

    /// Like [`Self::parsed`] for an optional setting, which a set variable sets (a blank
    /// value is an error like any unparsable one).
    pub(crate) fn parsed_some<T: FromStr<Err: Display>>(
        &self,
        name: &'static str,
        into: &mut Option<T>,
    ) -> Result<(), ConfigError> {
        self.parsed_as(name, into, Some)
    }

    fn parsed_as<T: FromStr<Err: Display>, U>(
        &self,
        name: &'static str,
        into: &mut U,
        wrap: impl FnOnce(T) -> U,
    ) -> Result<(), ConfigError> {
        if let Some(v) = self.get(name)? {
            *into = wrap(v);
        }
        Ok(())
    }

    /// Like [`Self::parsed`] for an optional setting: a blank value unsets it.
    pub(crate) fn parsed_or_none<T: FromStr<Err: Display>>(
        &self,
        name: &'static str,
        into: &mut Option<T>,
    ) -> Result<(), ConfigError> {
        if let Some(v) = self.raw(name) {
            *into = if v.trim().is_empty() {
                None
            } else {
                Some(parse(name, &v)?)
            };
        }
        Ok(())
    }

    /// Sets `into` to the boolean `name`, when set; a blank value is an error.
    pub(crate) fn flag(&self, name: &'static str, into: &mut bool) -> Result<(), ConfigError> {
        if let Some(v) = self.raw(name) {
            *into = parse_bool(name, &v)?;
        }
        Ok(())
    }

    /// Like [`Self::flag`], but a blank value means `false` (the Xiaozhi door's spelling).
    pub(crate) fn flag_blank_false(
        &self,
        name: &'static str,
        into: &mut bool,
    ) -> Result<(), ConfigError> {
        if let Some(v) = self.raw(name) {
            *into = parse_bool_blank_false(name, &v)?;
        }
        Ok(())
    }

    /// Sets `into` to the comma-separated list `name`, when set (empty: no entries).
    pub(crate) fn list(&self, name: &str, into: &mut Vec<String>) {
        if let Some(v) = self.raw(name) {
            *into = list(&v);
        }
    }

    /// Sets `into` to `name` exactly as given, when set.
    pub(crate) fn string(&self, name: &str, into: &mut String) {
        if let Some(v) = self.raw(name) {
            *into = v;
        }
    }

    /// Sets `into` to `name` without surrounding white space, when set.
    pub(crate) fn trimmed(&self, name: &str, into: &mut String) {
        if let Some(v) = self.raw(name) {
            v.trim().clone_into(into);
        }
    }

    /// Sets an optional string to `name` exactly as given (even blank), when set.
    pub(crate) fn optional(&self, name: &str, into: &mut Option<String>) {
        if let Some(v) = self.raw(name) {
            *into = Some(v);
        }
    }

    /// Sets an optional string (a key, a token) to `name` as given, when set; a blank value
    /// unsets it.
    pub(crate) fn non_blank(&self, name: &str, into: &mut Option<String>) {
        if let Some(v) = self.raw(name) {
            *into = Some(v).filter(|s| !s.trim().is_empty());
        }
    }
}

/// `v` (trimmed) parsed with [`FromStr`]; the error names the variable and the value.
pub(crate) fn parse<T: FromStr<Err: Display>>(
    name: &'static str,
    v: &str,
) -> Result<T, ConfigError> {
    v.trim().parse().map_err(|e| ConfigError::Env {
        name,
        message: format!("{v:?}: {e}"),
    })
}

/// `1 true yes on` / `0 false no off`, any case, surrounding white space ignored.
fn truth(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A boolean; anything else (blank included) is an error.
pub(crate) fn parse_bool(name: &'static str, v: &str) -> Result<bool, ConfigError> {
    truth(v).ok_or_else(|| ConfigError::Env {
        name,
        message: format!("{v:?} is not a boolean (true/false)"),
    })
}

/// A boolean where a blank value is `false`.
pub(crate) fn parse_bool_blank_false(name: &'static str, v: &str) -> Result<bool, ConfigError> {
    if v.trim().is_empty() {
        return Ok(false);
    }
    truth(v).ok_or_else(|| ConfigError::Env {
        name,
        message: format!("{v:?} is not a boolean"),
    })
}

/// A comma-separated list: entries trimmed, empty ones dropped.
pub(crate) fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A setting holding secrets, shown as `***` by `--print-config`.
pub(crate) trait Secret {
    /// Replaces the secret with `***`; an absent or empty one stays as it is, so the printed
    /// configuration still tells whether one is set.
    fn mask(&mut self);
}

/// `***`, what a masked secret shows.
const MASK: &str = "***";

impl Secret for String {
    fn mask(&mut self) {
        if !self.is_empty() {
            MASK.clone_into(self);
        }
    }
}

impl Secret for Option<String> {
    fn mask(&mut self) {
        if self.is_some() {
            *self = Some(MASK.to_owned());
        }
    }
}

/// Every entry of a list of keys or tokens.
impl Secret for Vec<String> {
    fn mask(&mut self) {
        self.iter_mut().for_each(|s| MASK.clone_into(s));
    }
}

/// Every value of a map (environment variables for a child process); keys stay readable.
impl Secret for std::collections::BTreeMap<String, String> {
    fn mask(&mut self) {
        self.values_mut().for_each(|s| MASK.clone_into(s));
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    /// A lookup holding one variable `V`.
    fn one(value: &str) -> impl Fn(&str) -> Option<String> + '_ {
        move |k: &str| (k == "V").then(|| value.to_owned())
    }

    fn env_message(r: Result<impl std::fmt::Debug, ConfigError>) -> String {
        match r {
            Err(ConfigError::Env { name, message }) => {
                assert_eq!(name, "V");
                message
            }
            other => panic!("expected an Env error, got {other:?}"),
        }
    }

    #[test]
    fn numbers_and_other_from_str_values() {
        let mut n = 7_u32;
        EnvVars::new(&one(" 42 ")).parsed("V", &mut n).unwrap();
        assert_eq!(n, 42);
        EnvVars::new(&one("x")).parsed("OTHER", &mut n).unwrap();
        assert_eq!(n, 42, "an unset variable leaves the setting alone");
        let mut i = 0_i32;
        EnvVars::new(&one("-90")).parsed("V", &mut i).unwrap();
        assert_eq!(i, -90);
        let msg = env_message(EnvVars::new(&one("12x")).parsed("V", &mut n));
        assert!(msg.starts_with("\"12x\": "), "{msg}");
        assert_eq!(n, 42, "a bad value leaves the setting alone");
        env_message(EnvVars::new(&one("-1")).parsed("V", &mut n));
        env_message(EnvVars::new(&one("")).parsed("V", &mut n));
        let mut f = 0.0_f64;
        EnvVars::new(&one("0.5")).parsed("V", &mut f).unwrap();
        assert!((f - 0.5).abs() < f64::EPSILON);
        let lookup = one("300");
        let e = EnvVars::new(&lookup);
        assert_eq!(e.get::<u16>("V").unwrap(), Some(300));
        assert_eq!(e.get::<u16>("NONE").unwrap(), None);
        env_message(e.get::<u8>("V"));
        let full = ConfigError::Env {
            name: "V",
            message: "m".into(),
        };
        assert_eq!(full.to_string(), "environment variable V: m");
    }

    #[test]
    fn optional_values_blank_unsets() {
        let mut a: Option<SocketAddr> = None;
        EnvVars::new(&one("0.0.0.0:8000"))
            .parsed_or_none("V", &mut a)
            .unwrap();
        assert_eq!(a.unwrap().port(), 8000);
        EnvVars::new(&one("  "))
            .parsed_or_none("V", &mut a)
            .unwrap();
        assert_eq!(a, None);
        env_message(EnvVars::new(&one("nope")).parsed_or_none("V", &mut a));
        let mut o: Option<u64> = None;
        EnvVars::new(&one(" 5 ")).parsed_some("V", &mut o).unwrap();
        assert_eq!(o, Some(5));
        EnvVars::new(&one("")).parsed_some("UNSET", &mut o).unwrap();
        assert_eq!(o, Some(5));
        env_message(EnvVars::new(&one(" ")).parsed_some("V", &mut o));
        assert_eq!(o, Some(5));
    }

    #[test]
    fn booleans() {
        for (v, want) in [
            ("1", true),
            ("TRUE", true),
            (" yes ", true),
            ("On", true),
            ("0", false),
            ("false", false),
            ("NO", false),
            ("off", false),
        ] {
            let mut b = !want;
            EnvVars::new(&one(v)).flag("V", &mut b).unwrap();
            assert_eq!(b, want, "{v:?}");
            let mut b = !want;
            EnvVars::new(&one(v)).flag_blank_false("V", &mut b).unwrap();
            assert_eq!(b, want, "{v:?}");
        }
        let mut b = true;
        assert_eq!(
            env_message(EnvVars::new(&one("maybe")).flag("V", &mut b)),
            "\"maybe\" is not a boolean (true/false)"
        );
        env_message(EnvVars::new(&one("")).flag("V", &mut b));
        assert!(b);
        EnvVars::new(&one(" "))
            .flag_blank_false("V", &mut b)
            .unwrap();
        assert!(!b);
        assert_eq!(
            env_message(EnvVars::new(&one("2")).flag_blank_false("V", &mut b)),
            "\"2\" is not a boolean"
        );
    }

    #[test]
    fn lists_and_strings() {
        let mut l = vec!["old".to_owned()];
        EnvVars::new(&one(" a, b ,,c ")).list("V", &mut l);
        assert_eq!(l, ["a", "b", "c"]);
        EnvVars::new(&one(" , ")).list("V", &mut l);
        assert!(l.is_empty());
        let mut s = String::from("old");
        EnvVars::new(&one(" x ")).string("V", &mut s);
        assert_eq!(s, " x ");
        EnvVars::new(&one(" x ")).trimmed("V", &mut s);
        assert_eq!(s, "x");
        EnvVars::new(&one("y")).trimmed("UNSET", &mut s);
        assert_eq!(s, "x");
        let mut o = None;
        EnvVars::new(&one(" ")).optional("V", &mut o);
        assert_eq!(o.as_deref(), Some(" "));
        EnvVars::new(&one(" k ")).non_blank("V", &mut o);
        assert_eq!(o.as_deref(), Some(" k "));
        EnvVars::new(&one(" ")).non_blank("V", &mut o);
        assert_eq!(o, None);
    }

    #[test]
    fn masking_keeps_absence_visible() {
        let mut s = String::new();
        s.mask();
        assert_eq!(s, "");
        let mut s = "secret".to_owned();
        s.mask();
        assert_eq!(s, "***");
        let mut o: Option<String> = None;
        o.mask();
        assert_eq!(o, None);
        let mut o = Some("k".to_owned());
        o.mask();
        assert_eq!(o.as_deref(), Some("***"));
        let mut v = vec!["a".to_owned(), "b".to_owned()];
        v.mask();
        assert_eq!(v, ["***", "***"]);
        let mut m = std::collections::BTreeMap::from([("KEY".to_owned(), "v".to_owned())]);
        m.mask();
        assert_eq!(m["KEY"], "***");
    }
}
