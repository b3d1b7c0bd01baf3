//! A throwaway certificate authority for a TLS cluster, made with the
//! `openssl` program in the cluster's directory: the CA's certificate
//! (which clients trust), and one certificate for `127.0.0.1` and
//! `localhost` signed by it, which every node of the cluster presents.

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{io_error, HarnessError};

/// The CA's certificate, for clients to trust.
pub(super) const CA_FILE: &str = "ca.pem";
/// The nodes' certificate and its key.
pub(super) const CERT_FILE: &str = "node.pem";
pub(super) const KEY_FILE: &str = "node.key";

/// Makes the CA and the nodes' certificate in `dir` (valid for a day).
pub(super) fn make(dir: &Path) -> Result<(), HarnessError> {
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n",
    )
    .map_err(|e| io_error(format!("writing san.cnf in {}", dir.display()), e))?;
    let rsa = ["-newkey", "rsa:2048", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509", "-days", "1"],
            &rsa,
            &[
                "-subj",
                "/CN=redlock-sync test CA",
                "-keyout",
                "ca.key",
                "-out",
                CA_FILE,
            ],
        ],
    )?;
    openssl(
        dir,
        &[
            &["req"],
            &rsa,
            &[
                "-subj",
                "/CN=localhost",
                "-keyout",
                KEY_FILE,
                "-out",
                "node.csr",
            ],
        ],
    )?;
    openssl(
        dir,
        &[
            &["x509", "-req", "-days", "1"],
            &[
                "-in",
                "node.csr",
                "-CA",
                CA_FILE,
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                "san.cnf",
                "-out",
                CERT_FILE,
            ],
        ],
    )
}

/// Runs `openssl` in `dir` with the arguments of `parts`, one after the
/// other; its error output goes into the error if it fails.
fn openssl(dir: &Path, parts: &[&[&str]]) -> Result<(), HarnessError> {
    let args = parts.concat();
    let what = format!("running `openssl {}`", args.join(" "));
    let output = Command::new("openssl")
        .args(&args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io_error(
                format!(
                    "{what} to make a TLS cluster's certificates (install openssl: \
                     Debian/Ubuntu `sudo apt-get install openssl`, macOS `brew install openssl`)"
                ),
                e,
            )
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(io_error(
        what,
        io::Error::other(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    ))
}
