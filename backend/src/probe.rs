//! What an image's first sector says it is, as QEMU's format probes read it.
//!
//! Why: an image opened without a format is probed. A raw image is the one format with no
//! header, so its first sector is whatever the guest wrote there; a guest that writes a
//! qcow2 header whose backing file is `/etc/shadow` turns the next probed open into an
//! export of that host file. QEMU's answer (block/raw-format.c) is to refuse, with `EPERM`,
//! writes to the first sector of a probed raw image that would make it probe as another
//! format; [`foreign_format`] is that test, over the formats QEMU probes in the first
//! 512 bytes, since QEMU's tools are as likely as corofuse to open the image next.
//! Formats recognised only by their name or their last sector (dmg, vpc's footer) are not
//! reachable from the first sector and are left out.

/// The bytes a probe reads: the first sector.
pub const PROBE_BYTES: usize = 512;

/// The format other than raw that a probe would take `sector` (the image's first bytes,
/// shorter if the image is) for, or `None`.
pub fn foreign_format(sector: &[u8]) -> Option<&'static str> {
    let starts = |magic: &[u8]| sector.starts_with(magic);
    // qcow (version 1) and qcow2 share their magic.
    if starts(b"QFI\xfb") {
        return Some("qcow2");
    }
    let formats: [(&[u8], &str); 10] = [
        (b"QED\0", "qed"),
        (b"KDMV", "vmdk"),
        (b"COWD", "vmdk"),
        (b"vhdxfile", "vhdx"),
        (b"conectix", "vpc"),
        (b"LUKS\xba\xbe", "luks"),
        (b"WithoutFreeSpace", "parallels"),
        (b"WithouFreSpacExt", "parallels"),
        (b"Bochs Virtual HD Image", "bochs"),
        (b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0", "cloop"),
    ];
    if let Some((_, name)) = formats.iter().find(|(magic, _)| starts(magic)) {
        return Some(name);
    }
    // VDI: a 64-byte text, then the signature 0xbeda107f, little-endian.
    if sector.get(0x40..0x44) == Some(&[0x7f, 0x10, 0xda, 0xbe]) {
        return Some("vdi");
    }
    is_vmdk_descriptor(sector).then_some("vmdk")
}

/// A VMDK text descriptor: comment lines (`#...`) and blank lines, then `version=1`,
/// `2` or `3` ending its line.
fn is_vmdk_descriptor(sector: &[u8]) -> bool {
    let mut rest = sector;
    loop {
        match rest.first() {
            None => return false,
            Some(b'#') => match rest.iter().position(|&b| b == b'\n') {
                Some(eol) => rest = &rest[eol + 1..],
                None => return false,
            },
            Some(b' ') => {
                let blanks = rest.iter().take_while(|&&b| b == b' ').count();
                rest = &rest[blanks..];
                rest = rest.strip_prefix(b"\r").unwrap_or(rest);
                match rest.strip_prefix(b"\n") {
                    Some(next) => rest = next,
                    None => return false,
                }
            }
            Some(_) => {
                return [b"version=1", b"version=2", b"version=3"].iter().any(|v| {
                    match rest.strip_prefix(*v) {
                        Some(end) => end.starts_with(b"\n") || end.starts_with(b"\r\n"),
                        None => false,
                    }
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sector(head: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; PROBE_BYTES];
        s[..head.len()].copy_from_slice(head);
        s
    }

    #[test]
    fn the_magics_of_the_formats_qemu_probes_are_foreign() {
        for (head, name) in [
            (&b"QFI\xfb\0\0\0\x03"[..], "qcow2"),
            (b"QFI\xfb\0\0\0\x01", "qcow2"),
            (b"QED\0", "qed"),
            (b"KDMV", "vmdk"),
            (b"COWD", "vmdk"),
            (b"vhdxfile", "vhdx"),
            (b"conectix", "vpc"),
            (b"LUKS\xba\xbe\0\x01", "luks"),
            (b"WithoutFreeSpace", "parallels"),
            (b"Bochs Virtual HD Image", "bochs"),
        ] {
            assert_eq!(foreign_format(&sector(head)), Some(name), "{head:?}");
        }
        let mut vdi = sector(b"<<< Oracle VM VirtualBox Disk Image >>>\n");
        vdi[0x40..0x44].copy_from_slice(&0xbeda_107fu32.to_le_bytes());
        assert_eq!(foreign_format(&vdi), Some("vdi"));
    }

    #[test]
    fn a_vmdk_descriptor_is_foreign_after_comments_and_blank_lines() {
        let text = b"# Disk DescriptorFile\n  \r\nversion=1\nCID=fffffffe\n";
        assert_eq!(foreign_format(&sector(text)), Some("vmdk"));
        assert_eq!(foreign_format(&sector(b"version=3\r\n")), Some("vmdk"));
        assert_eq!(foreign_format(&sector(b"version=4\n")), None);
        assert_eq!(foreign_format(&sector(b"x\nversion=1\n")), None);
        assert_eq!(foreign_format(b"# no end of line"), None);
    }

    #[test]
    fn ordinary_disk_contents_are_raw() {
        assert_eq!(foreign_format(&sector(b"")), None, "zeroes");
        let mut mbr = sector(b"\xeb\x63\x90\x10\x8e\xd0\xbc\0");
        mbr[510..].copy_from_slice(&[0x55, 0xaa]);
        assert_eq!(foreign_format(&mbr), None, "a boot sector");
        assert_eq!(foreign_format(b"QFI"), None, "shorter than the magic");
        assert_eq!(foreign_format(b""), None, "an empty image");
    }
}
