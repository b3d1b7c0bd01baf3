//! The builders' setter macro.

/// Builder setters: `$(#[doc])* name(arg: Type) => place = value;` makes
/// `pub fn name(mut self, arg: Type) -> Self`. It sets `self.place` to `value`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $($place:ident).+ = $value:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$($place).+ = $value;
            self
        }
    )*};
}
pub(crate) use setters;
