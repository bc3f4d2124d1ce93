//! Counter sets: one list declares a set's names (an enum, with each counter's doc comment)
//! and its size, so an array of its counters can never be sized apart from the enum.
//! [`counters!`](crate::counters) makes the enum; [`shard::Counters`](crate::shard::Counters)
//! (and any array of `COUNT` cells) is indexed by it.
//!
//! A variant is one counter, or a family of them (`Allocated[NR_ORDERS]`: one per order),
//! named member by member with `Allocated.at(order)`. Counters are numbered in declaration
//! order, a family's members in a row: no index is ever written by hand.
//!
//! Invariants: `COUNT` is the sum of the variants' widths; `first` of a variant is the sum of
//! the widths before it; `at(i)` panics unless `i < width`, and a family named without a
//! member panics, so no index lands on another counter.

use std::marker::PhantomData;

/// What indexes a set of counters: a variant of a [`counters!`](crate::counters) enum, a
/// family's [`Member`], or a bare `usize`.
pub trait CounterIndex: Copy {
    /// The size of the set (every array of its counters has this length); `None` for a bare
    /// `usize`, which any array takes, checked only against its bounds.
    const SET: Option<usize>;
    /// The place in `0..SET`.
    fn index(self) -> usize;
}

impl CounterIndex for usize {
    const SET: Option<usize> = None;
    #[inline]
    fn index(self) -> usize {
        self
    }
}

/// One member of a counter family (`Kind::Family.at(i)`): its place in the set of `C`.
pub struct Member<C> {
    index: usize,
    set: PhantomData<C>,
}

impl<C> Member<C> {
    /// Made only by the enum's `at`, which checks `index` against the family.
    #[doc(hidden)]
    pub const fn new_checked_by_at(index: usize) -> Self {
        Member {
            index,
            set: PhantomData,
        }
    }
}

impl<C> Clone for Member<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for Member<C> {}

impl<C: CounterIndex> CounterIndex for Member<C> {
    const SET: Option<usize> = C::SET;
    #[inline]
    fn index(self) -> usize {
        self.index
    }
}

/// Where each variant starts, given the variants' widths in order.
#[doc(hidden)]
pub const fn firsts<const K: usize>(widths: [usize; K]) -> [usize; K] {
    let mut firsts = [0; K];
    let (mut i, mut sum) = (0, 0);
    while i < K {
        firsts[i] = sum;
        sum += widths[i];
        i += 1;
    }
    firsts
}

/// The sum of the widths.
#[doc(hidden)]
pub const fn total(widths: &[usize]) -> usize {
    let (mut i, mut sum) = (0, 0);
    while i < widths.len() {
        sum += widths[i];
        i += 1;
    }
    sum
}

/// Declares a counter set: an enum of its counters (with their doc comments), `COUNT` (the
/// number of counters, the length of every array of them) and the enum's
/// [`CounterIndex`](crate::counter::CounterIndex). A variant followed by `[n]` is a family of
/// `n` counters (one per order, say), named member by member with `.at(i)`.
///
/// ```
/// ztier_base::counters! {
///     /// A device's counters.
///     pub enum Count {
///         /// Allocations, by order.
///         Allocated[4],
///         /// Discards.
///         Discarded,
///     }
/// }
/// let counters: ztier_base::shard::Counters<{ Count::COUNT }> = Default::default();
/// counters.add(Count::Allocated.at(2), 1);
/// counters.add(Count::Discarded, 3);
/// assert_eq!(Count::COUNT, 5);
/// assert_eq!(counters.sum(Count::Allocated.at(2)), 1);
/// assert_eq!(counters.sum(Count::Discarded), 3);
/// ```
#[macro_export]
macro_rules! counters {
    (@width) => { 1 };
    (@width $width:expr) => { $width };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident $([$width:expr])?),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        #[allow(dead_code)]
        impl $name {
            /// Each variant's width (1, or a family's size), in declaration order.
            const WIDTHS: &'static [usize] = &[$($crate::counters!(@width $($width)?)),+];
            /// Where each variant starts.
            const FIRSTS: &'static [usize] =
                &$crate::counter::firsts([$($crate::counters!(@width $($width)?)),+]);
            /// The number of counters (a family's members each count): the length of every
            /// array of them.
            pub const COUNT: usize = $crate::counter::total(Self::WIDTHS);

            /// 1, or the family's size.
            pub const fn width(self) -> usize {
                Self::WIDTHS[self as usize]
            }

            /// This counter's place in `0..COUNT`; a family must be named by a member.
            #[inline]
            pub const fn index(self) -> usize {
                assert!(self.width() == 1, "a counter family is counted by member: .at(i)");
                Self::FIRSTS[self as usize]
            }

            /// Member `i` of this family (`i < width`).
            #[inline]
            pub const fn at(self, i: usize) -> $crate::counter::Member<$name> {
                assert!(i < self.width(), "no such member of the counter family");
                $crate::counter::Member::new_checked_by_at(Self::FIRSTS[self as usize] + i)
            }
        }

        impl $crate::counter::CounterIndex for $name {
            const SET: Option<usize> = Some($name::COUNT);
            #[inline]
            fn index(self) -> usize {
                $name::index(self)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::CounterIndex;

    crate::counters! {
        /// A test set.
        enum Count {
            /// One.
            A,
            /// A family of three.
            B[3],
            C,
            D[2],
        }
    }

    #[test]
    fn counters_are_numbered_in_declaration_order() {
        assert_eq!(Count::COUNT, 7);
        assert_eq!(Count::A.index(), 0);
        let b: Vec<usize> = (0..3).map(|i| Count::B.at(i).index()).collect();
        assert_eq!(b, [1, 2, 3]);
        assert_eq!(Count::C.index(), 4);
        assert_eq!(Count::D.at(1).index(), 6);
        assert_eq!(<Count as CounterIndex>::SET, Some(7));
        assert_eq!(Count::B.width(), 3);
    }

    #[test]
    #[should_panic(expected = "no such member")]
    fn a_member_past_its_family_panics() {
        let _ = Count::B.at(3);
    }

    #[test]
    #[should_panic(expected = "counted by member")]
    fn a_family_without_a_member_panics() {
        let _ = Count::D.index();
    }
}
