//! Free fns: every option, field paths, patterns, aliases, `impl Trait` in return position.
#![deny(warnings)]

use std::fmt::Display;
use std::sync::Arc;

use lock_core::{distributed_lock, LockError, Locker};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

pub struct Customer {
    pub id: u64,
}

pub struct Order {
    pub customer: Customer,
    pub number: u32,
}

pub struct AppState {
    pub locker: Arc<Locker>,
}

/// Reserves stock: docs, attributes and visibility are kept.
#[distributed_lock(key = "inventory:<sku_id>", wait = "3s")]
#[must_use = "the reservation may have failed"]
#[inline]
pub async fn reserve(sku_id: u64, qty: u32) -> Result<u32, AppError> {
    if qty == 0 {
        return Err(AppError::OutOfStock);
    }
    Ok(qty)
}

#[distributed_lock(
    key = "order:<order.customer.id>:<order.number>/<pair.0>",
    wait = "0s",
    lease = "1m 30s",
    locker = state.locker,
    on_lost = "continue",
)]
pub(crate) async fn place(
    state: &AppState,
    order: Order,
    pair: (u8, String),
) -> Result<usize, AppError> {
    Ok(order.number as usize + pair.1.len())
}

/// `&Locker` parameter.
#[distributed_lock(key = "fixed", locker = locker, lease = "250ms", on_lost = "abort")]
async fn by_ref(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

/// An owned `Locker` from any expression.
#[distributed_lock(key = "owned:<id>", locker = make_locker())]
async fn owned(id: &str) -> Result<String, LockError> {
    Ok(id.to_owned())
}

fn make_locker() -> Locker {
    unimplemented!("never called: the test only compiles the future")
}

/// Patterns, `mut` and raw-identifier parameters; braces in the template.
#[distributed_lock(key = "{tag}:<a>:<b>:<r#type>:<<literal>")]
async fn patterns((a, b): (u32, u32), mut c: Vec<u8>, r#type: &str) -> Result<usize, LockError> {
    c.push(1);
    Ok((a + b) as usize + c.len() + r#type.len())
}

/// `?` on other errors, an error type other than an enum.
#[distributed_lock(key = "boxed")]
async fn boxed(input: &str) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    let n = input.parse::<u32>()?;
    Ok(n)
}

type AppResult<T> = Result<T, AppError>;

/// A `Result` alias, and an inner attribute.
#[distributed_lock(key = "alias")]
async fn alias() -> AppResult<()> {
    #![allow(clippy::let_unit_value)]
    let unit = ();
    Ok(unit)
}

/// `impl Trait` in the return type.
#[distributed_lock(key = "display")]
async fn returns_impl() -> Result<impl Display, LockError> {
    Ok(5)
}

/// The locker borrowed from a parameter that the body then moves.
#[distributed_lock(key = "owned_state:<id>", locker = state.locker)]
async fn owned_state(state: AppState, id: u32) -> Result<AppState, AppError> {
    let _ = id;
    Ok(state)
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(state: &AppState, locker: &Locker, owned: AppState) {
    assert_send(owned_state(owned, 1));
    assert_send(place(
        state,
        Order {
            customer: Customer { id: 1 },
            number: 2,
        },
        (3, String::new()),
    ));
    assert_send(by_ref(locker));
}

fn main() {
    assert_send(reserve(1, 2));
    assert_send(owned("x"));
    assert_send(patterns((1, 2), Vec::new(), "t"));
    assert_send(boxed("1"));
    assert_send(alias());
    assert_send(returns_impl());
}
