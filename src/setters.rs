//! The builders' setter macro.

/// Builder setters: `$(#[doc])* name(arg: Type) => place = value;` is
/// `pub fn name(mut self, arg: Type) -> Self`, which sets `self.place` to
/// `value` and returns `self`.
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
