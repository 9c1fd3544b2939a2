//! A kernel setting (a file under /proc/sys or /sys) changed for one run of the lab and put
//! back afterwards, so a benchmark that needs it leaves the machine as it found it.
//!
//! Used for `vm.max_map_count` (a million coroutine stacks, two mappings each) and for a
//! virtual machine's free page reporting ([`hold_page_reporting`]).

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

/// A guest's free page reporting (virtio-balloon): free blocks of 2^order pages go back
/// to the host, which drops them.
const PAGE_REPORTING: &str = "/sys/module/page_reporting/parameters/page_reporting_order";
/// One above the buddy allocator's largest order (10): no block is ever reported.
const NO_REPORTING_ORDER: &str = "11";

/// Holds a VM's free page reporting off while alive, where the kernel has it.
///
/// Why (issue 37): memory freed by one run (a tmpfs image deleted, a daemon's page cache
/// dropped) goes back to the host within milliseconds, and the next buffered writer
/// faults every page back in from the host: 1 MiB writes into the disk image ran at a
/// tenth of their speed with 4 ms of daemon CPU each, for whichever export and
/// configuration came first after memory was freed. That is the host's cost, not the
/// export's. Without the module (bare metal, no balloon) there is nothing to hold; when
/// the setting cannot be written, the run goes on with a warning.
pub fn hold_page_reporting() -> Option<Setting> {
    if !std::path::Path::new(PAGE_REPORTING).exists() {
        return None;
    }
    let need = "storage rows free of the host's page faults";
    match Setting::ensure(
        PAGE_REPORTING,
        NO_REPORTING_ORDER,
        |v| v == NO_REPORTING_ORDER,
        need,
    ) {
        Ok(held) => Some(held),
        Err(e) => {
            eprintln!("warning: {e}; buffered writes may pay the host's page faults");
            None
        }
    }
}

impl Setting {
    /// Whether this guard changed the setting (and puts it back when dropped).
    pub fn changed(&self) -> bool {
        self.restore.is_some()
    }
}

/// Memory [`warm_free_memory`] leaves untouched.
const WARM_MARGIN: u64 = 2 << 30;

/// Touches the machine's free memory but [`WARM_MARGIN`] once and frees it, after free
/// page reporting was found on and held off: what the idle guest reported before the run
/// is gone from the host, and the first buffered writer would fault it back in. Measured
/// (2026-12-06): after `drop_caches` and 15 s idle, the main job's first `disk` 1 MiB
/// write ran at 502 and 602 IOPS (0.14x the device, 2.6 ms of daemon CPU per request),
/// and at 4,073-5,835 right after; touching 4 GiB first did not help (602), touching all
/// free memory did (6,195). It costs the host's faults once: 40-45 s for 17.5 GiB here.
pub fn warm_free_memory() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let free_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemFree:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let bytes = (free_kib * 1024).saturating_sub(WARM_MARGIN);
    let Ok(bytes) = usize::try_from(bytes) else {
        return;
    };
    if bytes == 0 {
        return;
    }
    eprintln!(
        "touching {} MiB of free memory once, which the host took back while this VM was idle \
         (free page reporting), so that no run pays for it ...",
        bytes >> 20
    );
    let started = std::time::Instant::now();
    let mut area: Vec<u8> = Vec::new();
    if area.try_reserve_exact(bytes).is_err() {
        eprintln!("warning: cannot take it; the first storage rows may pay the host's page faults");
        return;
    }
    area.resize(bytes, 1); // writes every page
    std::hint::black_box(&area);
    drop(area);
    eprintln!("touched in {:.1} s", started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_suffices_is_left_alone_and_a_missing_one_is_an_error() {
        let kept = Setting::ensure("/proc/sys/vm/max_map_count", "1", |_| true, "the test")
            .expect("readable");
        assert!(kept.restore.is_none() && !kept.changed());
        let err = Setting::ensure("/proc/sys/no/such/setting", "1", |_| false, "the test")
            .err()
            .expect("missing");
        assert!(
            err.starts_with("the test needs /proc/sys/no/such/setting: "),
            "{err}"
        );
    }

    #[test]
    fn page_reporting_is_held_off_while_the_guard_lives_and_restored_after() {
        let Ok(before) = std::fs::read_to_string(PAGE_REPORTING) else {
            eprintln!("skipped: no {PAGE_REPORTING} (not a VM with free page reporting)");
            return;
        };
        if euid() != 0 {
            eprintln!("skipped: writing {PAGE_REPORTING} needs root");
            return;
        }
        let held = hold_page_reporting().expect("held as root");
        assert_eq!(held.changed(), before.trim() != NO_REPORTING_ORDER);
        let during = std::fs::read_to_string(PAGE_REPORTING).unwrap();
        assert_eq!(during.trim(), NO_REPORTING_ORDER);
        drop(held);
        assert_eq!(std::fs::read_to_string(PAGE_REPORTING).unwrap(), before);
    }

    fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }
}
