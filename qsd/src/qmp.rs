//! The QMP protocol as qemu-storage-daemon speaks it (docs/interop/qmp-spec.rst): the
//! greeting, capabilities negotiation, `id` echoed, errors as `{"error": {"class",
//! "desc"}}`, events with a `timestamp`. [`Session`] holds one connection's state and
//! turns each message into the text to send back; what the commands do is the caller's
//! ([`Commands`]).
//!
//! Messages are written as QEMU writes them: members in QEMU's order, `", "` and `": "`
//! between items, one message per line, so that a script comparing text sees no
//! difference (every client library parses JSON and would not care).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value};

/// A command's failure: QMP's error class and description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QmpError {
    /// `GenericError`, `CommandNotFound`, `DeviceNotFound`.
    pub class: &'static str,
    /// The sentence.
    pub desc: String,
}

impl QmpError {
    /// A `GenericError`.
    pub fn generic(desc: impl Into<String>) -> QmpError {
        QmpError {
            class: "GenericError",
            desc: desc.into(),
        }
    }
}

impl From<String> for QmpError {
    fn from(desc: String) -> QmpError {
        QmpError::generic(desc)
    }
}

/// What runs the commands once negotiation is done.
pub trait Commands {
    /// Runs command `name` with `arguments` (an object, empty if none were given).
    /// Unknown names answer [`not_found`].
    fn run(&mut self, name: &str, arguments: Value) -> Result<Value, QmpError>;
}

/// The error for a command that does not exist.
pub fn not_found(name: &str) -> QmpError {
    QmpError {
        class: "CommandNotFound",
        desc: format!("The command {name} has not been found"),
    }
}

/// QEMU's version, as `query-version` and the greeting give it.
#[derive(Clone, Debug, Serialize)]
pub struct Version {
    /// `{"micro", "minor", "major"}`.
    pub qemu: VersionTriple,
    /// `package`.
    pub package: String,
}

/// A version's three numbers (QEMU's member order).
#[derive(Clone, Debug, Serialize)]
pub struct VersionTriple {
    /// Micro.
    pub micro: u32,
    /// Minor.
    pub minor: u32,
    /// Major.
    pub major: u32,
}

/// One connection: before and after `qmp_capabilities`.
#[derive(Default)]
pub struct Session {
    negotiated: bool,
}

impl Session {
    /// The greeting sent when a client connects.
    pub fn greeting(version: &Version) -> String {
        format!(
            "{{\"QMP\": {{\"version\": {}, \"capabilities\": [\"oob\"]}}}}",
            text(version)
        )
    }

    /// The answer to one line from the client, or `None` for a blank line.
    pub fn handle(&mut self, line: &str, commands: &mut dyn Commands) -> Option<String> {
        if line.trim().is_empty() {
            return None;
        }
        let request = serde_json::from_str(line).map_err(|e| e.to_string());
        Some(self.handle_value(request, commands))
    }

    /// The answer to one message from the client's JSON stream (or why it did not parse).
    /// QMP messages need no line breaks between them: read them as a stream
    /// (`serde_json::Deserializer::into_iter`), not as lines.
    pub fn handle_value(
        &mut self,
        request: Result<Value, String>,
        commands: &mut dyn Commands,
    ) -> String {
        let request = match request {
            Ok(v) => v,
            Err(e) => return error(&QmpError::generic(format!("JSON parse error, {e}")), None),
        };
        let (name, arguments, id) = match parse_request(request) {
            Ok(parts) => parts,
            Err((e, id)) => return error(&QmpError::generic(e), id.as_ref()),
        };
        match self.dispatch(&name, arguments, commands) {
            Ok(value) => answer(&value, id.as_ref()),
            Err(e) => error(&e, id.as_ref()),
        }
    }

    fn dispatch(
        &mut self,
        name: &str,
        arguments: Value,
        commands: &mut dyn Commands,
    ) -> Result<Value, QmpError> {
        match (self.negotiated, name) {
            (false, "qmp_capabilities") => {
                check_capabilities(arguments)?;
                self.negotiated = true;
                Ok(Value::Object(Map::new()))
            }
            (false, _) => Err(QmpError {
                class: "CommandNotFound",
                desc: "Expecting capabilities negotiation with 'qmp_capabilities'".into(),
            }),
            (true, "qmp_capabilities") => Err(QmpError {
                class: "CommandNotFound",
                desc: "Capabilities negotiation is already complete, command ignored".into(),
            }),
            (true, _) => commands.run(name, arguments),
        }
    }

    /// Whether `qmp_capabilities` has been accepted (events go only to such sessions).
    pub fn negotiated(&self) -> bool {
        self.negotiated
    }
}

/// `qmp_capabilities` takes an optional `enable` list; corofuse offers no capability
/// (out-of-band execution is advertised, as by qsd, but every command runs in order).
fn check_capabilities(arguments: Value) -> Result<(), QmpError> {
    let mut f = crate::fields::Fields::new(arguments, false)?;
    if let Some(Value::Array(caps)) = f.take("enable") {
        if let Some(cap) = caps.iter().find(|c| c.as_str() != Some("oob")) {
            return Err(QmpError::generic(format!(
                "Parameter 'enable' does not accept value '{}'",
                cap.as_str().unwrap_or_default()
            )));
        }
    }
    f.finish()?;
    Ok(())
}

/// A request's `execute`, `arguments` and `id`.
type Request = (String, Value, Option<Value>);

/// `execute`, `arguments` and `id` of a request, or why it is malformed (with its id).
fn parse_request(request: Value) -> Result<Request, (String, Option<Value>)> {
    let Value::Object(mut map) = request else {
        return Err(("QMP input must be a JSON object".into(), None));
    };
    let id = map.remove("id");
    let known = ["execute", "exec-oob", "arguments", "control"];
    if let Some(key) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err((format!("QMP input member '{key}' is unexpected"), id));
    }
    let name = match (map.remove("execute"), map.remove("exec-oob")) {
        (Some(Value::String(n)), None) | (None, Some(Value::String(n))) => n,
        (None, None) => return Err(("QMP input lacks member 'execute'".into(), id)),
        _ => return Err(("QMP input member 'execute' must be a string".into(), id)),
    };
    let arguments = match map.remove("arguments") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(("QMP input member 'arguments' must be an object".into(), id)),
    };
    Ok((name, arguments, id))
}

/// `{"return": VALUE, "id": ID}`.
pub fn answer(value: &Value, id: Option<&Value>) -> String {
    match id {
        Some(id) => format!("{{\"return\": {}, \"id\": {}}}", text(value), text(id)),
        None => format!("{{\"return\": {}}}", text(value)),
    }
}

/// `{"id": ID, "error": {"class": CLASS, "desc": DESC}}`.
pub fn error(e: &QmpError, id: Option<&Value>) -> String {
    let body = format!(
        "{{\"class\": {}, \"desc\": {}}}",
        text(&e.class),
        text(&e.desc)
    );
    match id {
        Some(id) => format!("{{\"id\": {}, \"error\": {body}}}", text(id)),
        None => format!("{{\"error\": {body}}}"),
    }
}

/// An event now: `{"timestamp": {"seconds", "microseconds"}, "event": NAME, "data": DATA}`.
pub fn event(name: &str, data: &Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{{\"timestamp\": {{\"seconds\": {}, \"microseconds\": {}}}, \"event\": {}, \"data\": {}}}",
        now.as_secs(),
        now.subsec_micros(),
        text(&name),
        text(data)
    )
}

/// JSON as QEMU writes it: `", "` between items and `": "` after keys.
pub fn text<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    value
        .serialize(&mut ser)
        .expect("a JSON value serialises into memory");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// ", " before every array value and object key but the first, as QEMU writes them.
fn separator<W: ?Sized + std::io::Write>(writer: &mut W, first: bool) -> std::io::Result<()> {
    match first {
        true => Ok(()),
        false => writer.write_all(b", "),
    }
}

/// serde_json's compact format with QEMU's spaces.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Echo;
    impl Commands for Echo {
        fn run(&mut self, name: &str, arguments: Value) -> Result<Value, QmpError> {
            match name {
                "echo" => Ok(arguments),
                _ => Err(not_found(name)),
            }
        }
    }

    #[test]
    fn negotiation_ids_and_errors_as_qsd_writes_them() {
        let mut s = Session::default();
        let mut run = |line: &str| s.handle(line, &mut Echo).unwrap();
        assert_eq!(
            run(r#"{"execute": "echo"}"#),
            r#"{"error": {"class": "CommandNotFound", "desc": "Expecting capabilities negotiation with 'qmp_capabilities'"}}"#
        );
        assert_eq!(
            run(r#"{"execute": "qmp_capabilities", "id": 7}"#),
            r#"{"return": {}, "id": 7}"#
        );
        assert_eq!(
            run(r#"{"execute": "nope", "id": "x"}"#),
            r#"{"id": "x", "error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}}"#
        );
        assert_eq!(
            run(r#"{"execute": "echo", "arguments": {"a": [1, 2]}}"#),
            r#"{"return": {"a": [1, 2]}}"#
        );
        assert_eq!(
            run(r#"{"foo": 1}"#),
            r#"{"error": {"class": "GenericError", "desc": "QMP input member 'foo' is unexpected"}}"#
        );
        assert!(event("SHUTDOWN", &json!({"guest": false})).contains(r#""event": "SHUTDOWN""#));
    }
}
