//! A string enum whose unknown values are kept as data.

/// Declares a `#[non_exhaustive]` enum of known wire strings plus `Other(String)`.
///
/// Parsing never fails on an unknown string: it becomes `Other`, so a newer peer does not break
/// an older server. `From<&str>`/`From<String>` map known spellings to their variants, which keeps
/// `Other` from ever holding a known spelling when built through them.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this crate does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// Every known value, in declaration order.
            pub const KNOWN: &'static [$name] = &[$( $name::$variant ),+];

            /// The wire spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Other(other) => other,
                }
            }

            fn known(value: &str) -> Option<Self> {
                match value {
                    $( $wire => Some(Self::$variant), )+
                    _ => None,
                }
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::known(value).unwrap_or_else(|| Self::Other(value.to_owned()))
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::known(&value).unwrap_or(Self::Other(value))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct V;
                impl ::serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok($name::from(v))
                    }
                    fn visit_string<E: ::serde::de::Error>(self, v: String) -> Result<$name, E> {
                        Ok($name::from(v))
                    }
                }
                deserializer.deserialize_str(V)
            }
        }
    };
}

pub(crate) use string_enum;
