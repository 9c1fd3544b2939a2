//! A kernel setting (a file under /proc/sys or /sys) changed for one run of the lab and put
//! back afterwards, so a benchmark that needs it leaves the machine as it found it.
//!
//! Used for the fuse module's `enable_uring` (FUSE over io_uring) and for
//! `vm.max_map_count` (a million coroutine stacks, two mappings each).

/// While alive, the setting holds the wanted value; dropping it writes back what it found.
pub struct Setting {
    path: &'static str,
    /// The value found at start, when this guard changed it.
    restore: Option<String>,
}

impl Setting {
    /// Writes `value` to `path` unless what is there already `suffices`; says so on stderr.
    /// `need` names what needs it, for the errors.
    pub fn ensure(
        path: &'static str,
        value: &str,
        suffices: impl Fn(&str) -> bool,
        need: &str,
    ) -> Result<Setting, String> {
        let found =
            std::fs::read_to_string(path).map_err(|e| format!("{need} needs {path}: {e}"))?;
        let found = found.trim().to_string();
        if suffices(&found) {
            return Ok(Setting {
                path,
                restore: None,
            });
        }
        std::fs::write(path, value).map_err(|e| {
            format!(
                "{need} needs {path} set to {value} (it is {found}), and writing it failed: {e}"
            )
        })?;
        eprintln!("set {path} to {value} for this run (was {found}; restored at the end)");
        Ok(Setting {
            path,
            restore: Some(found),
        })
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        if let Some(v) = &self.restore {
            if let Err(e) = std::fs::write(self.path, v) {
                eprintln!(
                    "corofuse-lab bench: cannot restore {} to {v}: {e}",
                    self.path
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_suffices_is_left_alone_and_a_missing_one_is_an_error() {
        let kept = Setting::ensure("/proc/sys/vm/max_map_count", "1", |_| true, "the test")
            .expect("readable");
        assert!(kept.restore.is_none());
        let err = Setting::ensure("/proc/sys/no/such/setting", "1", |_| false, "the test")
            .err()
            .expect("missing");
        assert!(
            err.starts_with("the test needs /proc/sys/no/such/setting: "),
            "{err}"
        );
    }
}
