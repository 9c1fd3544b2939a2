//! [`Fields`]: reads one option's JSON tree into typed values, member by member, with
//! QEMU's input visitor's error sentences ("Parameter 'size' expects integer",
//! "Parameter 'bogus' is unexpected"). A tree from keyval has only string leaves, which
//! are converted (`on`/`off`, decimal integers); one from JSON must have the right types.

use serde_json::{Map, Value};

/// The members of one JSON object not read yet.
pub struct Fields {
    map: Map<String, Value>,
    keyval: bool,
    /// Dotted path of this object inside the option, with a trailing dot ("cache.").
    prefix: String,
}

impl Fields {
    /// The top-level object of an option (`keyval`: the tree came from keyval syntax).
    pub fn new(value: Value, keyval: bool) -> Result<Fields, String> {
        Self::nested(value, keyval, String::new())
    }

    fn nested(value: Value, keyval: bool, prefix: String) -> Result<Fields, String> {
        match value {
            Value::Object(map) => Ok(Fields {
                map,
                keyval,
                prefix,
            }),
            _ => Err(format!(
                "Invalid parameter type for '{}', expected: object",
                prefix.trim_end_matches('.')
            )),
        }
    }

    /// The full name of member `key`, as errors say it.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Error "Parameter 'KEY' is missing".
    pub fn missing(&self, key: &str) -> String {
        format!("Parameter '{}' is missing", self.name(key))
    }

    fn wrong_type(&self, key: &str, expected: &str) -> String {
        format!(
            "Invalid parameter type for '{}', expected: {expected}",
            self.name(key)
        )
    }

    /// Whether member `key` is there (still unread).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Takes member `key` as it is.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    /// An optional string.
    pub fn str(&mut self, key: &str) -> Result<Option<String>, String> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong_type(key, "string")),
        }
    }

    /// A string that must be there.
    pub fn req_str(&mut self, key: &str) -> Result<String, String> {
        self.str(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional boolean (`on`/`off` in keyval, as QEMU also `yes`/`no`/`true`/`false`).
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, String> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) if !self.keyval => Ok(Some(b)),
            Some(Value::String(s)) if self.keyval => match s.as_str() {
                "on" | "yes" | "true" | "y" => Ok(Some(true)),
                "off" | "no" | "false" | "n" => Ok(Some(false)),
                _ => Err(format!(
                    "Parameter '{}' expects 'on' or 'off'",
                    self.name(key)
                )),
            },
            Some(_) => Err(self.wrong_type(key, "boolean")),
        }
    }

    /// An optional non-negative integer.
    pub fn int(&mut self, key: &str) -> Result<Option<u64>, String> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) if !self.keyval => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "integer")),
            Some(Value::String(s)) if self.keyval => s
                .parse()
                .map(Some)
                .map_err(|_| format!("Parameter '{}' expects integer", self.name(key))),
            Some(_) => Err(self.wrong_type(key, "integer")),
        }
    }

    /// An optional string that must be one of `allowed`.
    pub fn choice(&mut self, key: &str, allowed: &[&str]) -> Result<Option<String>, String> {
        let value = self.str(key)?;
        match value {
            Some(v) if !allowed.contains(&v.as_str()) => Err(self.rejects(key, &v)),
            v => Ok(v),
        }
    }

    /// Error "Parameter 'KEY' does not accept value 'VALUE'".
    pub fn rejects(&self, key: &str, value: &str) -> String {
        format!(
            "Parameter '{}' does not accept value '{value}'",
            self.name(key)
        )
    }

    /// An optional nested object.
    pub fn object(&mut self, key: &str) -> Result<Option<Fields>, String> {
        let prefix = format!("{}.", self.name(key));
        self.take(key)
            .map(|v| Fields::nested(v, self.keyval, prefix))
            .transpose()
    }

    /// Whether the tree came from keyval syntax.
    pub fn keyval(&self) -> bool {
        self.keyval
    }

    /// Fails on the first member nobody read: "Parameter 'bogus' is unexpected".
    pub fn finish(self) -> Result<(), String> {
        match self.map.keys().next() {
            Some(key) => Err(format!("Parameter '{}' is unexpected", self.name(key))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keyval_strings_convert_and_json_must_be_typed() {
        let mut f = Fields::new(json!({"a": "on", "n": "12", "c": {"d": "x"}}), true).unwrap();
        assert_eq!(f.bool("a"), Ok(Some(true)));
        assert_eq!(f.int("n"), Ok(Some(12)));
        let mut c = f.object("c").unwrap().unwrap();
        assert_eq!(
            c.choice("d", &["y"]).unwrap_err(),
            "Parameter 'c.d' does not accept value 'x'"
        );
        let mut j = Fields::new(json!({"size": "5", "b": 1}), false).unwrap();
        assert_eq!(
            j.int("size").unwrap_err(),
            "Invalid parameter type for 'size', expected: integer"
        );
        assert_eq!(j.finish().unwrap_err(), "Parameter 'b' is unexpected");
        let mut k = Fields::new(json!({"size": "1M", "r": "maybe"}), true).unwrap();
        assert_eq!(
            k.int("size").unwrap_err(),
            "Parameter 'size' expects integer"
        );
        assert_eq!(
            k.bool("r").unwrap_err(),
            "Parameter 'r' expects 'on' or 'off'"
        );
        assert_eq!(k.req_str("x").unwrap_err(), "Parameter 'x' is missing");
    }
}
