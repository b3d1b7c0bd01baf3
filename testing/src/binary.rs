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
    let Some(name) = env_value.filter(|value| !value.is_empty()) else {
        return search_path(OsStr::new("redis-server"), path_var.as_deref()).ok_or_else(|| {
            HarnessError::NotInstalled {
                searched: "redis-server was not found on PATH".to_owned(),
            }
        });
    };
    let as_path = PathBuf::from(&name);
    let shown = as_path.display();
    if as_path.is_absolute() || as_path.components().count() > 1 {
        // A path (absolute or relative): use it as is.
        return if is_executable(&as_path) {
            Ok(as_path)
        } else {
            Err(HarnessError::NotInstalled {
                searched: format!("REDIS_SERVER is `{shown}`, which is not an executable file"),
            })
        };
    }
    search_path(&name, path_var.as_deref()).ok_or_else(|| HarnessError::NotInstalled {
        searched: format!("REDIS_SERVER is `{shown}`, which was not found on PATH"),
    })
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

    fn searched(err: HarnessError) -> String {
        match err {
            HarnessError::NotInstalled { searched } => searched,
            other => panic!("expected NotInstalled, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_binary_says_how_to_install_redis_and_how_to_point_at_another() {
        let err = find_redis_server(
            Some(OsString::from("/nonexistent/redis-server")),
            std::env::var_os("PATH"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "REDIS_SERVER is `/nonexistent/redis-server`, which is not an executable file: \
             install Redis (Debian/Ubuntu: `sudo apt-get install redis-server`; \
             macOS: `brew install redis`), or set REDIS_SERVER to the server binary to run, \
             a path or a name found on PATH, which may be a valkey-server \
             (for example REDIS_SERVER=/usr/local/bin/valkey-server)"
        );

        let err = find_redis_server(None, Some(OsString::from("/nonexistent-dir"))).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("redis-server was not found on PATH: install Redis"),
            "{message}"
        );
        assert!(message.contains("sudo apt-get install redis-server"));
        assert!(message.contains("brew install redis"));
        assert!(message.contains("REDIS_SERVER=/usr/local/bin/valkey-server"));

        assert_eq!(
            searched(find_redis_server(None, None).unwrap_err()),
            "redis-server was not found on PATH"
        );
        assert_eq!(
            searched(
                find_redis_server(
                    Some(OsString::from("valkey-server")),
                    Some("/nonexistent".into())
                )
                .unwrap_err()
            ),
            "REDIS_SERVER is `valkey-server`, which was not found on PATH"
        );
        // A directory is not an executable.
        assert_eq!(
            searched(find_redis_server(Some(OsString::from("/tmp")), None).unwrap_err()),
            "REDIS_SERVER is `/tmp`, which is not an executable file"
        );
    }

    #[cfg(unix)]
    #[test]
    fn redis_server_on_path_or_any_binary_redis_server_names_is_found() {
        // Whatever binary this run uses (redis-server, or a valkey-server
        // from REDIS_SERVER) stands in for both names in a folder of links.
        let real = redis_server_binary().unwrap();
        assert!(is_executable(&real));
        let dir =
            std::env::temp_dir().join(format!("redlock-sync-binary-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for name in ["redis-server", "valkey-server"] {
            let link = dir.join(name);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(&real, &link).unwrap();
        }
        let path_var = Some(dir.clone().into_os_string());

        let by_default = find_redis_server(None, path_var.clone());
        let by_name = find_redis_server(Some("valkey-server".into()), path_var.clone());
        let by_path = find_redis_server(Some(dir.join("valkey-server").into()), None);
        let empty_is_unset = find_redis_server(Some(OsString::new()), path_var);
        fs::remove_dir_all(&dir).unwrap();

        assert_eq!(by_default.unwrap(), dir.join("redis-server"));
        assert_eq!(by_name.unwrap(), dir.join("valkey-server"));
        assert_eq!(by_path.unwrap(), dir.join("valkey-server"));
        assert_eq!(empty_is_unset.unwrap(), dir.join("redis-server"));
    }
}
