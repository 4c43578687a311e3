//! A prefix listed page by page into a bounded channel, in a task of its
//! own: the pull's first GETs start after the first page, a slow consumer
//! holds the lister back, and a push that resumes reads the store's view
//! the same way.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::Engine;
use crate::metrics::Operation;
use crate::store::{ListPage, StoreError};

/// Lists `prefix` page by page into `pages` until done, failed or dropped.
pub(super) async fn list_all(engine: Arc<Engine>, prefix: String, pages: mpsc::Sender<Result<ListPage, StoreError>>) {
    let mut token: Option<String> = None;
    loop {
        let page = engine.retrying(Operation::List, || engine.store.list_page(&prefix, token.clone())).await;
        match page {
            Err(e) => {
                let _ = pages.send(Err(e)).await;
                return;
            }
            Ok(page) => {
                let next = page.next.clone();
                if pages.send(Ok(page)).await.is_err() {
                    return;
                }
                match next {
                    Some(next) => token = Some(next),
                    None => return,
                }
            }
        }
    }
}
