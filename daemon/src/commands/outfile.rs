//! Output files (`record -o`, `snapshot --html`, `compare --html`) written safely, also by root
//! into a directory other users can write (/tmp): the data goes to a new file with a random
//! name in the target's directory, created with O_CREAT|O_EXCL (never an existing file, never
//! through a symlink), and is renamed over the target once complete. A symlink planted at the
//! target is replaced, not followed; nobody sees half a file under the target's name; a file
//! that is never completed is removed.
use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

/// A file being written, renamed to its target by [`OutFile::commit`]; removed if dropped
/// before.
pub struct OutFile {
    tmp: tempfile::NamedTempFile,
    target: PathBuf,
}

impl OutFile {
    /// A new, empty file beside `target` (".NAME.XXXXXXXX.tmp"), mode 0666 less the umask
    /// as for any new file.
    pub fn create(target: &Path) -> io::Result<Self> {
        let (dir, prefix) = beside(target)?;
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .rand_bytes(8)
            .permissions(fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)?;
        Ok(Self {
            tmp,
            target: target.to_path_buf(),
        })
    }

    /// Where the data goes until the commit.
    pub fn tmp_path(&self) -> &Path {
        self.tmp.path()
    }

    pub fn file(&self) -> &fs::File {
        self.tmp.as_file()
    }

    /// Flushed to disk, then renamed over the target.
    pub fn commit(self) -> io::Result<()> {
        self.tmp.as_file().sync_all()?;
        let target = self.target;
        self.tmp.persist(&target).map(|_| ()).map_err(|e| {
            io::Error::new(
                e.error.kind(),
                format!("cannot rename it to {}: {}", target.display(), e.error),
            )
        })
    }
}

/// A private directory beside `target` (".NAME.XXXXXXXX.ring", mode 0700, made new: never
/// one that was there) for a ring's segments; removed with what is in it when dropped.
pub fn ring_dir(target: &Path) -> io::Result<tempfile::TempDir> {
    let (dir, prefix) = beside(target)?;
    tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".ring")
        .rand_bytes(8)
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir_in(dir)
}

/// The directory of `target` and the ".NAME." prefix of what is made beside it.
fn beside(target: &Path) -> io::Result<(&Path, std::ffi::OsString)> {
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", target.display()),
        )
    })?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    Ok((dir, prefix))
}

/// Writes `bytes` to `target` the safe way.
pub fn write(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let out = OutFile::create(target)?;
    out.file().write_all(bytes)?;
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ethand-outfile-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A symlink at the target (to a file the writer must not touch) is replaced by the new
    /// file; the file it pointed to keeps its content.
    #[test]
    fn a_symlink_at_the_target_is_replaced_not_followed() {
        let d = dir("symlink");
        let victim = d.join("victim");
        fs::write(&victim, "precious").unwrap();
        let target = d.join("out.json");
        symlink(&victim, &target).unwrap();
        write(&target, b"report").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(
            !fs::symlink_metadata(&target)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "report");
        fs::remove_dir_all(&d).unwrap();
    }

    /// The old predictable name (FILE.tmp) planted as a symlink changes nothing; an
    /// uncommitted file leaves nothing behind.
    #[test]
    fn temporary_names_are_unpredictable_and_cleaned_up() {
        let d = dir("tmpname");
        let victim = d.join("victim");
        fs::write(&victim, "precious").unwrap();
        let target = d.join("trace.json");
        symlink(&victim, d.join("trace.json.tmp")).unwrap();
        let out = OutFile::create(&target).unwrap();
        let tmp = out.tmp_path().to_path_buf();
        assert!(
            tmp.starts_with(&d) && tmp != d.join("trace.json.tmp"),
            "{tmp:?}"
        );
        out.file().write_all(b"partial").unwrap();
        drop(out);
        assert!(!tmp.exists(), "uncommitted file left behind");
        assert!(!target.exists());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_target_is_an_error() {
        let d = dir("isdir");
        fs::create_dir(d.join("sub")).unwrap();
        assert!(write(&d.join("sub"), b"x").is_err());
        assert!(write(Path::new("/"), b"x").is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
