//! The SASL and TLS command-line options, turned into the client's settings.
//!
//! The password never goes on the command line (where `ps` and shell history would show it): it comes from
//! `SNAPFENCE_SASL_PASSWORD` or from the file named by `--sasl-password-file`. OAUTHBEARER's token comes
//! from the file named by `--sasl-oauth-token-file`, read again whenever the token it held is due (its
//! JWT `exp`), so a file another program refreshes is followed.
//!
//! # References
//! - KIP-84 (SCRAM), RFC 4616 (PLAIN); Kafka's `security.protocol` SASL_PLAINTEXT / SSL / SASL_SSL

use std::path::{Path, PathBuf};

use snapfence::net::{ClientConfig, OAuthBearer, SaslConfig, SaslMechanism};

use crate::error::CliError;

/// The environment variable the SASL password is read from.
pub const PASSWORD_ENV: &str = "SNAPFENCE_SASL_PASSWORD";

/// A SASL mechanism as spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mechanism {
    /// SASL/PLAIN.
    Plain,
    /// SASL/SCRAM-SHA-256.
    #[value(name = "scram-sha-256")]
    ScramSha256,
    /// SASL/SCRAM-SHA-512.
    #[value(name = "scram-sha-512")]
    ScramSha512,
    /// SASL/OAUTHBEARER, with the token in --sasl-oauth-token-file.
    #[value(name = "oauthbearer")]
    OAuthBearer,
    /// AWS MSK IAM (OAUTHBEARER with a SigV4-signed token), for --aws-region, with credentials from
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
    #[cfg(feature = "aws-msk-iam")]
    #[value(name = "aws-msk-iam")]
    AwsMskIam,
}

impl From<Mechanism> for SaslMechanism {
    fn from(m: Mechanism) -> SaslMechanism {
        match m {
            Mechanism::Plain => SaslMechanism::Plain,
            Mechanism::ScramSha256 => SaslMechanism::ScramSha256,
            Mechanism::ScramSha512 => SaslMechanism::ScramSha512,
            Mechanism::OAuthBearer => SaslMechanism::OAuthBearer,
            #[cfg(feature = "aws-msk-iam")]
            Mechanism::AwsMskIam => SaslMechanism::OAuthBearer,
        }
    }
}

/// SASL and TLS options, shared by every subcommand that connects.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecurityArgs {
    /// Log in with SASL using this mechanism (needs --sasl-username and a password).
    #[arg(long, value_enum, global = true, env = "SNAPFENCE_SASL_MECHANISM")]
    pub sasl_mechanism: Option<Mechanism>,
    /// The SASL user name.
    #[arg(
        long,
        global = true,
        env = "SNAPFENCE_SASL_USERNAME",
        value_name = "USER"
    )]
    pub sasl_username: Option<String>,
    /// Read the SASL password from this file (one line) instead of SNAPFENCE_SASL_PASSWORD.
    #[arg(long, global = true, value_name = "FILE")]
    pub sasl_password_file: Option<PathBuf>,
    /// OAUTHBEARER: the file holding the bearer token (a JWT), read again when the token is due.
    #[arg(
        long,
        global = true,
        env = "SNAPFENCE_SASL_OAUTH_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub sasl_oauth_token_file: Option<PathBuf>,
    /// AWS MSK IAM: the cluster's region (us-east-1, ...).
    #[cfg(feature = "aws-msk-iam")]
    #[arg(long, global = true, env = "AWS_REGION", value_name = "REGION")]
    pub aws_region: Option<String>,
    /// Connect with TLS (implied by --tls-ca).
    #[cfg(feature = "tls")]
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM file of the CA certificates that sign the brokers' certificates.
    #[cfg(feature = "tls")]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this client's certificate chain, for brokers that require client certificates.
    #[cfg(feature = "tls")]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of this client's private key (with --tls-cert).
    #[cfg(feature = "tls")]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

fn usage(message: impl Into<String>, hint: impl Into<String>) -> CliError {
    CliError::Usage {
        message: message.into(),
        hint: hint.into(),
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| {
        usage(
            format!("cannot read the {what} file {}: {e}", path.display()),
            format!("check the path given for the {what}"),
        )
    })
}

impl SecurityArgs {
    /// `base` with the SASL and TLS settings these options ask for. `password_env` is the value of
    /// [`PASSWORD_ENV`] (passed in so tests need not touch the process environment).
    pub fn apply(
        &self,
        base: ClientConfig,
        password_env: Option<String>,
    ) -> Result<ClientConfig, CliError> {
        let mut config = base;
        if self.sasl_oauth_token_file.is_some()
            && self.sasl_mechanism != Some(Mechanism::OAuthBearer)
        {
            return Err(usage(
                "--sasl-oauth-token-file needs --sasl-mechanism oauthbearer",
                "add --sasl-mechanism oauthbearer",
            ));
        }
        match (self.sasl_mechanism, &self.sasl_username) {
            #[cfg(feature = "aws-msk-iam")]
            (Some(Mechanism::AwsMskIam), user) => {
                if user.is_some() || self.sasl_password_file.is_some() {
                    return Err(usage(
                        "AWS MSK IAM signs with AWS credentials, not a user name and password",
                        "drop --sasl-username and --sasl-password-file; set AWS_ACCESS_KEY_ID and \
                         AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials)",
                    ));
                }
                let Some(region) = &self.aws_region else {
                    return Err(usage(
                        "--sasl-mechanism aws-msk-iam needs the cluster's region",
                        "pass --aws-region REGION (or set AWS_REGION)",
                    ));
                };
                let oauth = OAuthBearer::aws_msk_iam_from_env(region.clone())
                    .map_err(|e| usage(e.to_string(), "pass --aws-region like us-east-1"))?;
                config.sasl = Some(SaslConfig::oauthbearer(oauth));
            }
            (Some(Mechanism::OAuthBearer), user) => {
                if user.is_some() || self.sasl_password_file.is_some() {
                    return Err(usage(
                        "OAUTHBEARER logs in with a token, not a user name and password",
                        "drop --sasl-username and --sasl-password-file; the token's subject is the principal",
                    ));
                }
                let Some(file) = &self.sasl_oauth_token_file else {
                    return Err(usage(
                        "--sasl-mechanism oauthbearer needs a token",
                        "pass --sasl-oauth-token-file FILE (or set SNAPFENCE_SASL_OAUTH_TOKEN_FILE)",
                    ));
                };
                // Read once now, so a wrong path is a usage error before anything connects.
                read(file, "OAUTHBEARER token")?;
                config.sasl = Some(SaslConfig::oauthbearer(OAuthBearer::token_file(file)));
            }
            (None, None) => {}
            (None, Some(_)) => {
                return Err(usage(
                    "--sasl-username needs --sasl-mechanism",
                    "add --sasl-mechanism plain, scram-sha-256 or scram-sha-512",
                ))
            }
            (Some(_), None) => {
                return Err(usage(
                    "--sasl-mechanism needs --sasl-username",
                    "add --sasl-username USER (or set SNAPFENCE_SASL_USERNAME)",
                ))
            }
            (Some(mechanism), Some(user)) => {
                let password = match (&self.sasl_password_file, password_env) {
                    (Some(file), _) => {
                        let text = read(file, "SASL password")?;
                        String::from_utf8(text)
                            .map_err(|_| {
                                usage("the SASL password file is not UTF-8", "check the file")
                            })?
                            .trim_end_matches(['\r', '\n'])
                            .to_owned()
                    }
                    (None, Some(p)) => p,
                    (None, None) => {
                        return Err(usage(
                            "SASL needs a password",
                            format!("set {PASSWORD_ENV} or pass --sasl-password-file FILE"),
                        ))
                    }
                };
                config.sasl = Some(SaslConfig::new(mechanism.into(), user.clone(), password));
            }
        }
        #[cfg(feature = "tls")]
        {
            if self.tls_cert.is_some() != self.tls_key.is_some() {
                return Err(usage(
                    "--tls-cert and --tls-key go together",
                    "pass both the client certificate and its key, or neither",
                ));
            }
            let wanted = self.tls || self.tls_ca.is_some() || self.tls_cert.is_some();
            if wanted {
                let ca = self.tls_ca.as_deref().ok_or_else(|| {
                    usage(
                        "TLS needs the CA certificates that sign the brokers' certificates",
                        "pass --tls-ca FILE (PEM)",
                    )
                })?;
                let mut tls = snapfence::net::TlsConfig::new(read(ca, "TLS CA")?);
                if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
                    tls =
                        tls.with_client_cert(read(cert, "TLS certificate")?, read(key, "TLS key")?);
                }
                config.tls = Some(tls);
            }
        }
        Ok(config)
    }

    /// [`SecurityArgs::apply`] with the password from [`PASSWORD_ENV`].
    pub fn client_config(&self, base: ClientConfig) -> Result<ClientConfig, CliError> {
        self.apply(base, std::env::var(PASSWORD_ENV).ok())
    }

    /// Whether a TLS option was given (connections are then encrypted end to end).
    pub fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        if self.tls || self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_key.is_some() {
            return true;
        }
        false
    }

    /// Whether any SASL or TLS option was given.
    pub fn is_set(&self) -> bool {
        #[cfg(feature = "tls")]
        if self.tls || self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_key.is_some() {
            return true;
        }
        self.sasl_mechanism.is_some()
            || self.sasl_username.is_some()
            || self.sasl_password_file.is_some()
            || self.sasl_oauth_token_file.is_some()
    }

    /// These options as command-line arguments, for a child `snapfence` process that must connect the
    /// same way (the demo's owner A). The password is not among them: the child inherits
    /// [`PASSWORD_ENV`] or is given the same password file.
    pub fn child_args(&self) -> Vec<std::ffi::OsString> {
        use clap::ValueEnum;
        let mut out: Vec<std::ffi::OsString> = Vec::new();
        if let Some(m) = self.sasl_mechanism.and_then(|m| m.to_possible_value()) {
            out.extend(["--sasl-mechanism".into(), m.get_name().into()]);
        }
        if let Some(user) = &self.sasl_username {
            out.extend(["--sasl-username".into(), user.into()]);
        }
        if let Some(file) = &self.sasl_password_file {
            out.extend(["--sasl-password-file".into(), file.into()]);
        }
        if let Some(file) = &self.sasl_oauth_token_file {
            out.extend(["--sasl-oauth-token-file".into(), file.into()]);
        }
        #[cfg(feature = "aws-msk-iam")]
        if let Some(region) = &self.aws_region {
            out.extend(["--aws-region".into(), region.into()]);
        }
        #[cfg(feature = "tls")]
        {
            if self.tls {
                out.push("--tls".into());
            }
            for (flag, path) in [
                ("--tls-ca", &self.tls_ca),
                ("--tls-cert", &self.tls_cert),
                ("--tls-key", &self.tls_key),
            ] {
                if let Some(path) = path {
                    out.extend([flag.into(), path.into()]);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Probe {
        #[command(flatten)]
        security: SecurityArgs,
    }

    /// `given` as a child process parses its `child_args`.
    fn parsed_back(given: &SecurityArgs) -> SecurityArgs {
        use clap::Parser;
        let mut argv: Vec<std::ffi::OsString> = vec!["probe".into()];
        argv.extend(given.child_args());
        Probe::try_parse_from(argv).unwrap().security
    }

    /// A child process given `child_args` must connect exactly as its parent does.
    #[test]
    fn child_args_parse_back_to_the_same_options() {
        use clap::Parser;
        let given = Probe::try_parse_from([
            "probe",
            "--sasl-mechanism",
            "scram-sha-256",
            "--sasl-username",
            "alice",
            "--sasl-password-file",
            "/run/pw",
        ])
        .unwrap()
        .security;
        let back = parsed_back(&given);
        assert!(back.is_set());
        assert_eq!(back.sasl_mechanism, Some(Mechanism::ScramSha256));
        assert_eq!(back.sasl_username.as_deref(), Some("alice"));
        assert_eq!(back.sasl_password_file, given.sasl_password_file);
        assert!(!SecurityArgs::default().is_set());
        assert!(SecurityArgs::default().child_args().is_empty());
    }

    fn args(m: Option<Mechanism>, user: Option<&str>) -> SecurityArgs {
        SecurityArgs {
            sasl_mechanism: m,
            sasl_username: user.map(str::to_owned),
            ..SecurityArgs::default()
        }
    }

    /// SASL is configured only with a mechanism, a user and a password together; any one without the
    /// others is a usage error, never a half-configured login.
    #[test]
    fn sasl_needs_mechanism_user_and_password_together() {
        let base = || ClientConfig::new("h:1");
        assert!(args(None, None).apply(base(), None).unwrap().sasl.is_none());
        for bad in [
            args(Some(Mechanism::Plain), None),
            args(None, Some("u")),
            args(Some(Mechanism::Plain), Some("u")), // no password anywhere
        ] {
            let err = bad.apply(base(), None).unwrap_err();
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE, "{err}");
        }
        let ok = args(Some(Mechanism::ScramSha512), Some("u"))
            .apply(base(), Some("pw".into()))
            .unwrap();
        let sasl = ok.sasl.unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
        assert_eq!(
            (sasl.username.as_str(), sasl.password.as_str()),
            ("u", "pw")
        );
    }

    /// OAUTHBEARER takes a token file and nothing else: no user name, no password, and no token file
    /// with another mechanism. A missing file is a usage error before anything connects. The option
    /// survives the trip to a child process.
    #[test]
    fn oauthbearer_takes_a_token_file_alone() {
        let dir = std::env::temp_dir().join(format!("snapfence-cli-oauth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.\n").unwrap();
        let base = || ClientConfig::new("h:1");
        let oauth = |user: Option<&str>, token: Option<&std::path::Path>| SecurityArgs {
            sasl_oauth_token_file: token.map(std::path::Path::to_path_buf),
            ..args(Some(Mechanism::OAuthBearer), user)
        };
        let sasl = oauth(None, Some(&file))
            .apply(base(), None)
            .unwrap()
            .sasl
            .unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::OAuthBearer);
        assert!(sasl.oauth_bearer.is_some());
        for bad in [
            oauth(None, None),
            oauth(Some("u"), Some(&file)),
            oauth(None, Some(&dir.join("missing"))),
            SecurityArgs {
                sasl_oauth_token_file: Some(file.clone()),
                ..args(Some(Mechanism::Plain), Some("u"))
            },
        ] {
            let err = bad.apply(base(), Some("pw".into())).unwrap_err();
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE, "{err}");
        }
        let back = parsed_back(&oauth(None, Some(&file)));
        assert_eq!(back.sasl_mechanism, Some(Mechanism::OAuthBearer));
        assert_eq!(back.sasl_oauth_token_file.as_deref(), Some(file.as_path()));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// AWS MSK IAM needs a region and no user name or password; a region that is no AWS region name is
    /// a usage error before anything connects.
    #[cfg(feature = "aws-msk-iam")]
    #[test]
    fn aws_msk_iam_needs_a_region_alone() {
        let base = || ClientConfig::new("h:1");
        let iam = |user: Option<&str>, region: Option<&str>| SecurityArgs {
            aws_region: region.map(str::to_owned),
            ..args(Some(Mechanism::AwsMskIam), user)
        };
        let sasl = iam(None, Some("eu-central-1"))
            .apply(base(), None)
            .unwrap()
            .sasl
            .unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::OAuthBearer);
        assert!(sasl.oauth_bearer.is_some());
        for bad in [
            iam(None, None),
            iam(Some("u"), Some("eu-central-1")),
            iam(None, Some("EU Central")),
        ] {
            let err = bad.apply(base(), Some("pw".into())).unwrap_err();
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE, "{err}");
        }
    }

    /// A password file takes precedence over the environment, and its trailing newline is not part of
    /// the password.
    #[test]
    fn the_password_file_wins_and_loses_its_newline() {
        let dir = std::env::temp_dir().join(format!("snapfence-cli-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let mut a = args(Some(Mechanism::Plain), Some("u"));
        a.sasl_password_file = Some(file);
        let config = a
            .apply(ClientConfig::new("h:1"), Some("from-env".into()))
            .unwrap();
        assert_eq!(config.sasl.unwrap().password, "from-file");
        let _ = std::fs::remove_dir_all(dir);
    }
}
