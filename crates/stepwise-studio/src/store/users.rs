//! People: accounts (Argon2id password hashes), sessions (a random token in the cookie, its
//! SHA-256 in the database, so a copy of the database logs nobody in).

use super::Store;
use crate::settings::Role;
use crate::time::now;
use anyhow::{bail, Result};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use rand::RngCore;
use rusqlite::{params, OptionalExtension};
use sha2::{Digest, Sha256};

/// How long a login lasts.
pub const SESSION_SECONDS: f64 = 12.0 * 3600.0;

/// The person behind a request.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionUser {
    /// Row id.
    pub id: i64,
    /// Their name.
    pub name: String,
    /// What they may do.
    pub role: Role,
}

/// Why a login failed; the page says the same for both.
#[derive(Debug, PartialEq, Eq)]
pub enum LoginError {
    /// No such user, or the wrong password: not told apart.
    Refused,
}

fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hash_password(password: &str) -> Result<String> {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| anyhow::anyhow!("encoding a salt: {e}"))?;
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| anyhow::anyhow!("hashing the password: {e}"))?
        .to_string())
}

impl Store {
    /// Creates the account `name` (or sets its role and password if it exists).
    pub fn set_user(&mut self, name: &str, role: Role, password: &str) -> Result<()> {
        if name.trim().is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            bail!("a user name is 1 to 64 characters without control characters");
        }
        if password.chars().count() < 8 {
            bail!("a password has at least 8 characters");
        }
        let hash = hash_password(password)?;
        self.db.execute(
            "INSERT INTO users (name, role, password, created) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE SET role = excluded.role, password = excluded.password",
            params![name, role.to_string(), hash, now()],
        )?;
        // A new password ends the account's sessions.
        self.db.execute(
            "DELETE FROM sessions WHERE user_id = (SELECT id FROM users WHERE name = ?1)",
            [name],
        )?;
        Ok(())
    }

    /// Every account: (name, role).
    pub fn users(&self) -> Result<Vec<(String, Role)>> {
        let mut q = self.db.prepare("SELECT name, role FROM users ORDER BY name")?;
        let rows = q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        rows.map(|r| {
            let (n, role) = r?;
            Ok((n, role.parse().map_err(anyhow::Error::msg)?))
        })
        .collect()
    }

    /// Checks `password` and opens a session: its token (for the cookie) and the user.
    pub fn login(
        &mut self,
        name: &str,
        password: &str,
    ) -> Result<std::result::Result<(String, SessionUser), LoginError>> {
        let found: Option<(i64, String, String)> = self
            .db
            .query_row("SELECT id, role, password FROM users WHERE name = ?1", [name], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        // A missing user costs the same hash as a wrong password (no timing oracle).
        static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let dummy = DUMMY.get_or_init(|| hash_password("no such user").unwrap_or_default());
        let stored = found.as_ref().map_or(dummy.as_str(), |f| f.2.as_str());
        let ok = PasswordHash::new(stored)
            .map(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
            .unwrap_or(false);
        let Some((id, role, _)) = found.filter(|_| ok) else {
            return Ok(Err(LoginError::Refused));
        };
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let t = now();
        self.db.execute("DELETE FROM sessions WHERE expires < ?1", [t])?;
        self.db.execute(
            "INSERT INTO sessions (token_sha256, user_id, expires) VALUES (?1, ?2, ?3)",
            params![digest(&token), id, t + SESSION_SECONDS],
        )?;
        let role = role.parse().map_err(anyhow::Error::msg)?;
        Ok(Ok((
            token,
            SessionUser {
                id,
                name: name.to_string(),
                role,
            },
        )))
    }

    /// The user of a session token, if it is open.
    pub fn session(&self, token: &str) -> Result<Option<SessionUser>> {
        let row: Option<(i64, String, String)> = self
            .db
            .query_row(
                "SELECT u.id, u.name, u.role FROM sessions s JOIN users u ON u.id = s.user_id
                 WHERE s.token_sha256 = ?1 AND s.expires > ?2",
                params![digest(token), now()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        row.map(|(id, name, role)| {
            Ok(SessionUser {
                id,
                name,
                role: role.parse().map_err(anyhow::Error::msg)?,
            })
        })
        .transpose()
    }

    /// Ends a session.
    pub fn logout(&mut self, token: &str) -> Result<()> {
        self.db
            .execute("DELETE FROM sessions WHERE token_sha256 = ?1", [digest(token)])?;
        Ok(())
    }
}
