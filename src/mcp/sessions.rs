//! MCP sessions any replica can serve (issue 11 item 4).
//!
//! Clients of MCP 2026-07-28 have no sessions: every request carries its protocol version and
//! client capabilities, and rmcp serves it statelessly, so any replica answers it. Clients of
//! older protocol versions (the TypeScript SDK 1.32, the rmcp client's `serve`) open a session
//! with `initialize` and send its `Mcp-Session-Id` on every request; the only state ferry's
//! tools read from a session is the client's `initialize` parameters (its capabilities decide
//! whether job tools answer with a native task). That state lives in the catalog through
//! rmcp's [`SessionStore`]: a replica that does not hold a session in memory loads it and
//! replays the handshake, so a round-robin load balancer needs no sticky sessions.
//!
//! What stays per replica: the session's standalone `GET` stream (ferry sends nothing on it:
//! no server-initiated requests, no list-changed notifications) and a request's own response
//! stream (progress notifications of `task_get` go there, to the replica serving the call).
//! Task state and input requests are in the catalog already.
//!
//! A session id is not a credential: every request is authorised by its own bearer token, and
//! the principal comes from the request, never from the session.

use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::{SessionState, SessionStore, SessionStoreError};

use crate::catalog::Catalog;
use crate::upload::now_ms;

/// Sessions not restored or created for this long are forgotten (the client then gets 404
/// and initializes again, as MCP prescribes for an unknown session).
pub const SESSION_IDLE: Duration = Duration::from_secs(7 * 24 * 3600);

/// rmcp's session store on ferry's catalog (SQLite or PostgreSQL).
pub struct CatalogSessions {
    catalog: Arc<dyn Catalog>,
}

impl CatalogSessions {
    pub fn new(catalog: Arc<dyn Catalog>) -> CatalogSessions {
        CatalogSessions { catalog }
    }
}

#[async_trait::async_trait]
impl SessionStore for CatalogSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match self.catalog.get_mcp_session(session_id, now_ms()).await? {
            Some(text) => Ok(Some(serde_json::from_str(&text)?)),
            None => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let now = now_ms();
        self.catalog.put_mcp_session(session_id, &serde_json::to_string(state)?, now).await?;
        // Creating a session is rare next to tool calls: prune idle ones here rather than
        // in a sweeper of its own.
        self.catalog.forget_mcp_sessions(now - SESSION_IDLE.as_millis() as i64).await?;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        Ok(self.catalog.delete_mcp_session(session_id).await?)
    }
}
