//! Finding the server binary: `REDIS_SERVER` (a path, or a name looked up
//! on `PATH`, so it may name a `valkey-server` too), else `redis-server` on
//! `PATH`. Nothing is found means [`HarnessError::NotInstalled`], never a
//! silent skip.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};

use super::HarnessError;

/// The `redis-server` to run, from `REDIS_SERVER` or `PATH`.
pub(super) fn redis_server_binary() -> Result<PathBuf, HarnessError> {
    find_redis_server(std::env::var_os("REDIS_SERVER"), std::env::var_os("PATH"))
}

fn find_redis_server(
    env_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, HarnessError> {
    let name = match env_value {
        Some(value) if !value.is_empty() => value,
        _ => OsString::from("redis-server"),
    };
    let as_path = PathBuf::from(&name);
    if as_path.is_absolute() || as_path.components().count() > 1 {
        // A path (absolute or relative): use it as is.
        return if is_executable(&as_path) {
            Ok(as_path)
        } else {
            Err(HarnessError::NotInstalled)
        };
    }
    search_path(&name, path_var.as_deref()).ok_or(HarnessError::NotInstalled)
}

pub(super) fn search_path(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path_var?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    let Ok(meta) = fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_is_not_installed() {
        let err = find_redis_server(
            Some(OsString::from("/nonexistent/redis-server")),
            std::env::var_os("PATH"),
        )
        .unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        let message = err.to_string();
        assert_eq!(
            message,
            "redis-server not found on PATH: install it (Debian/Ubuntu: `sudo apt-get install redis-server`, \
             macOS: `brew install redis`) or set REDIS_SERVER to its path"
        );
        assert!(
            message.contains("sudo apt-get install redis-server"),
            "{message}"
        );
        assert!(message.contains("brew install redis"), "{message}");
        assert!(message.contains("REDIS_SERVER"), "{message}");

        let err = find_redis_server(None, Some(OsString::from("/nonexistent-dir"))).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        let err = find_redis_server(None, None).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        // A directory is not an executable.
        let err = find_redis_server(Some(OsString::from("/tmp")), None).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));

        // The real one is found through PATH, or REDIS_SERVER as a name.
        let found = redis_server_binary().unwrap();
        assert!(is_executable(&found));
        let dir = found.parent().unwrap().as_os_str().to_owned();
        let name = found.file_name().unwrap().to_owned();
        assert_eq!(
            find_redis_server(Some(name), Some(dir.clone())).unwrap(),
            found
        );
        assert_eq!(find_redis_server(None, Some(dir)).unwrap(), found);
    }
}
