//! Walking a paged listing (a rule's blocks or overrides) to its end with its cursor.

use std::future::Future;

use tollgate::store::{Cursor, Page};
use tollgate::LimitError;

/// Every item of the listing `page_at` answers, page after page from the first until one has no
/// next cursor, in the order given; and each page's size.
pub async fn every_page<T, F, Fut>(mut page_at: F) -> (Vec<T>, Vec<usize>)
where
    F: FnMut(Option<Cursor>) -> Fut,
    Fut: Future<Output = Result<Page<T>, LimitError>>,
{
    let (mut items, mut sizes) = (Vec::new(), Vec::new());
    let mut cursor = None;
    loop {
        let page = page_at(cursor).await.unwrap();
        sizes.push(page.items.len());
        items.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return (items, sizes),
        }
        assert!(sizes.len() < 10_000, "the walk ends");
    }
}
