//! Sealed secrets. Only ciphertext, nonce and key id are stored.

use crate::{Db, DbError, Tx};

/// A sealed value as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SealedSecretRow {
    pub id: String,
    pub owner: String,
    pub purpose: String,
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// Stores a sealed value.
pub async fn secret_insert_in_txn(tx: &mut Tx<'_>, s: &SealedSecretRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO sealed_secrets (id, owner, purpose, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&s.id)
    .bind(&s.owner)
    .bind(&s.purpose)
    .bind(&s.key_id)
    .bind(&s.nonce)
    .bind(&s.ciphertext)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Reads a sealed value.
pub async fn secret_fetch(db: &Db, id: &str) -> Result<SealedSecretRow, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, owner, purpose, key_id, nonce, ciphertext FROM sealed_secrets WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await?)
}

/// Forgets a sealed value (the node must no longer refer to it).
pub async fn secret_delete_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM sealed_secrets WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// How many sealed values are stored.
pub async fn secret_count(db: &Db) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM sealed_secrets")
        .fetch_one(db.pool())
        .await?)
}

/// Reads a sealed value in a transaction.
pub async fn secret_fetch_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<SealedSecretRow, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, owner, purpose, key_id, nonce, ciphertext FROM sealed_secrets WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&mut **tx)
    .await?)
}

/// The owner's sealed value of `purpose` (the newest), e.g. a dedicated
/// node's teardown password.
pub async fn secret_of_owner_in_txn(
    tx: &mut Tx<'_>,
    owner: &str,
    purpose: &str,
) -> Result<Option<SealedSecretRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, owner, purpose, key_id, nonce, ciphertext FROM sealed_secrets \
         WHERE owner = $1 AND purpose = $2 ORDER BY id DESC LIMIT 1",
    )
    .bind(owner)
    .bind(purpose)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Forgets the owner's sealed values of `purpose`.
pub async fn secrets_delete_of_owner_in_txn(
    tx: &mut Tx<'_>,
    owner: &str,
    purpose: &str,
) -> Result<(), DbError> {
    sqlx::query("DELETE FROM sealed_secrets WHERE owner = $1 AND purpose = $2")
        .bind(owner)
        .bind(purpose)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
