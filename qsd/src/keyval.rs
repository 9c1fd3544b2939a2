//! QEMU's keyval syntax (util/keyval.c), as qemu-storage-daemon reads `--blockdev`,
//! `--export` and `--object`: `key=value` pairs separated by `,`, where `,,` in a value is
//! a comma, dotted keys `a.b=1` build nested objects, and an object whose keys are all
//! `0`, `1`, ... is a list (`iothread.0=a,iothread.1=b`). The first pair may be a bare
//! value for the option's implied key (`--blockdev file,...` is `driver=file`). A later
//! duplicate of a key replaces the earlier value, as in QEMU.
//!
//! The result is the same JSON tree `--blockdev '{...}'` gives, except that every leaf is
//! a string: [`crate::fields`] converts them, as QEMU's keyval input visitor does.
//! Errors are QEMU's own sentences ("Expected '=' after parameter 'size'").

use serde_json::{Map, Value};

/// Parses `text`; `implied` is the key of a leading bare value, if the option has one.
pub fn parse(text: &str, implied: Option<&str>) -> Result<Value, String> {
    let mut root = Map::new();
    let mut rest = text;
    let mut first = true;
    while !rest.is_empty() || first {
        let (key, value, next) = pair(rest, if first { implied } else { None })?;
        insert(&mut root, &key, value)?;
        rest = next;
        first = false;
        if rest.is_empty() {
            break;
        }
    }
    lists(Value::Object(root), "")
}

/// One `key=value` (or an implied key's bare value) at the start of `text`; returns the
/// key, the value with `,,` unescaped, and the text after the separating comma.
fn pair<'t>(text: &'t str, implied: Option<&str>) -> Result<(String, String, &'t str), String> {
    let key_end = text.find(['=', ',']).unwrap_or(text.len());
    let key = &text[..key_end];
    let has_value = text[key_end..].starts_with('=');
    let (key, value_start) = match (has_value, implied) {
        (true, _) => (key.to_string(), key_end + 1),
        (false, Some(implied)) if !key.is_empty() => (implied.to_string(), 0),
        (false, _) if !valid_key(key) => return Err(format!("Invalid parameter '{key}'")),
        (false, _) => return Err(format!("Expected '=' after parameter '{key}'")),
    };
    if !valid_key(&key) {
        return Err(format!("Invalid parameter '{key}'"));
    }
    let mut value = String::new();
    let bytes = &text[value_start..];
    let mut chars = bytes.char_indices().peekable();
    let mut end = bytes.len();
    while let Some((i, c)) = chars.next() {
        if c == ',' {
            if chars.peek().map(|&(_, c)| c) == Some(',') {
                chars.next();
                value.push(',');
                continue;
            }
            end = i;
            break;
        }
        value.push(c);
    }
    let after = &bytes[end..];
    Ok((key, value, after.strip_prefix(',').unwrap_or(after)))
}

/// A key: fragments of letters, digits, `-` and `_` separated by single dots.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.split('.').all(|f| {
            !f.is_empty()
                && f.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

fn insert(root: &mut Map<String, Value>, key: &str, value: String) -> Result<(), String> {
    let mut map = root;
    let fragments: Vec<&str> = key.split('.').collect();
    for (i, fragment) in fragments.iter().enumerate() {
        let prefix = fragments[..=i].join(".");
        if i + 1 == fragments.len() {
            if map.get(*fragment).is_some_and(Value::is_object) {
                return Err(format!("Parameters '{prefix}.*' used inconsistently"));
            }
            map.insert(fragment.to_string(), Value::String(value));
            return Ok(());
        }
        let entry = map
            .entry(fragment.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        map = match entry {
            Value::Object(inner) => inner,
            _ => return Err(format!("Parameters '{prefix}.*' used inconsistently")),
        };
    }
    Ok(())
}

/// Turns every object whose keys are all decimal indices into a list, checking that the
/// indices run 0, 1, ... with no gap ("Parameter 'x.1' missing").
fn lists(value: Value, path: &str) -> Result<Value, String> {
    let Value::Object(map) = value else {
        return Ok(value);
    };
    let at = |key: &str| match path {
        "" => key.to_string(),
        _ => format!("{path}.{key}"),
    };
    let indexed = !map.is_empty() && map.keys().all(|k| k.bytes().all(|b| b.is_ascii_digit()));
    if !indexed {
        let mut out = Map::new();
        for (key, inner) in map {
            let inner = lists(inner, &at(&key))?;
            out.insert(key, inner);
        }
        return Ok(Value::Object(out));
    }
    let mut items: Vec<(usize, Value)> = Vec::new();
    for (key, inner) in map {
        let index = key
            .parse()
            .map_err(|_| format!("Invalid parameter '{}'", at(&key)))?;
        items.push((index, lists(inner, &at(&key))?));
    }
    items.sort_by_key(|&(i, _)| i);
    for (want, (index, _)) in items.iter().enumerate() {
        if *index != want {
            return Err(format!("Parameter '{}' missing", at(&want.to_string())));
        }
    }
    Ok(Value::Array(items.into_iter().map(|(_, v)| v).collect()))
}

/// An option's argument as qemu-storage-daemon takes it: JSON if it starts with `{`
/// (after blanks), else keyval. The flag says which, since keyval leaves are strings.
pub fn parse_option(text: &str, implied: Option<&str>) -> Result<(Value, bool), String> {
    if text.trim_start().starts_with('{') {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("JSON parse error, {e}"))?;
        return Ok((value, false));
    }
    Ok((parse(text, implied)?, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_keys_lists_escapes_and_the_implied_key() {
        let v = parse(
            "file,node-name=a,,b,cache.direct=on,iothread.0=x,iothread.1=y",
            Some("driver"),
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"driver": "file", "node-name": "a,b", "cache": {"direct": "on"},
                   "iothread": ["x", "y"]})
        );
        assert_eq!(
            parse("a=1,a=2", None).unwrap(),
            json!({"a": "2"}),
            "later wins"
        );
        assert_eq!(parse("a=", None).unwrap(), json!({"a": ""}));
    }

    #[test]
    fn errors_are_qemus() {
        let err = |text, implied| parse(text, implied).unwrap_err();
        assert_eq!(
            err("null-co,size", Some("driver")),
            "Expected '=' after parameter 'size'"
        );
        assert_eq!(err("a..b=1", None), "Invalid parameter 'a..b'");
        assert_eq!(err(",a=1", Some("driver")), "Invalid parameter ''");
        assert_eq!(
            err("cache.direct=on,cache=x", None),
            "Parameters 'cache.*' used inconsistently"
        );
        assert_eq!(err("x.0=1,x.2=3", None), "Parameter 'x.1' missing");
        assert_eq!(
            err("null-co,null-co", Some("driver")),
            "Expected '=' after parameter 'null-co'"
        );
    }

    #[test]
    fn json_is_taken_as_is() {
        let (v, keyval) = parse_option(r#"{"driver":"null-co","size":5}"#, Some("driver")).unwrap();
        assert_eq!(v, json!({"driver": "null-co", "size": 5}));
        assert!(!keyval);
    }
}
