//! An id slab: items in a `Vec`, named by their index (a `u32` id), with the ids of removed
//! items reused last-freed first. The zspages of a size class, the blocks of a zblock type,
//! the entries of a handle table.
//!
//! Invariants: an id is either live or on the free list, never both; a freed item keeps its
//! place (and whatever its owner left in it, such as a generation count) until its id is
//! handed out again; ids never exceed the slab's `max_id`.

/// Items named by `u32` ids.
#[derive(Debug, Clone)]
pub struct IdSlab<T> {
    items: Vec<T>,
    free: Vec<u32>,
    max_id: u32,
}

/// No id is left: every one up to the slab's `max_id` is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabFull {
    /// How many ids the slab can name.
    pub capacity: u64,
}

impl<T> Default for IdSlab<T> {
    fn default() -> Self {
        IdSlab::with_max_id(u32::MAX - 1)
    }
}

impl<T> IdSlab<T> {
    /// A slab handing out ids `0..=max_id` (at most `u32::MAX - 1`: `u32::MAX` is
    /// [`crate::NONE`]).
    pub fn with_max_id(max_id: u32) -> IdSlab<T> {
        assert!(max_id < u32::MAX, "u32::MAX is NONE");
        IdSlab {
            items: Vec::new(),
            free: Vec::new(),
            max_id,
        }
    }

    /// Whether an insert would succeed.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty() || self.items.len() <= self.max_id as usize
    }

    /// The id the next insert hands out, if there is room.
    pub fn next_id(&self) -> Result<u32, SlabFull> {
        match self.free.last() {
            Some(&id) => Ok(id),
            None if self.items.len() <= self.max_id as usize => Ok(self.items.len() as u32),
            None => Err(SlabFull {
                capacity: self.max_id as u64 + 1,
            }),
        }
    }

    /// Puts `item` in the place of the id [`next_id`](Self::next_id) names and returns it.
    pub fn insert(&mut self, item: T) -> Result<u32, SlabFull> {
        let id = self.next_id()?;
        if self.free.pop().is_some() {
            self.items[id as usize] = item;
        } else {
            self.items.push(item);
        }
        Ok(id)
    }

    /// As [`insert`](Self::insert), but `make` builds the item from what a reused place held
    /// (`None` for a new place), so an item can carry state across lives (a generation).
    pub fn insert_with(&mut self, make: impl FnOnce(Option<&mut T>) -> T) -> Result<u32, SlabFull> {
        let id = self.next_id()?;
        if self.free.pop().is_some() {
            let slot = &mut self.items[id as usize];
            *slot = make(Some(slot));
        } else {
            self.items.push(make(None));
        }
        Ok(id)
    }

    /// Gives `id` back; its item stays in place until the id is reused. The caller must not
    /// remove an id twice (ids are checked live by their owners' generations or states).
    pub fn remove(&mut self, id: u32) {
        debug_assert!(!self.free.contains(&id), "id {id} removed twice");
        assert!(
            (id as usize) < self.items.len(),
            "id {id} was never handed out"
        );
        self.free.push(id);
    }

    /// The item at `id`, live or freed; `None` past every id handed out.
    pub fn get(&self, id: u32) -> Option<&T> {
        self.items.get(id as usize)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.items.get_mut(id as usize)
    }

    /// Every place, live or freed, indexed by id (what a list links through).
    pub fn items(&self) -> &[T] {
        &self.items
    }

    pub fn items_mut(&mut self) -> &mut [T] {
        &mut self.items
    }

    /// Ids live now.
    pub fn live(&self) -> usize {
        self.items.len() - self.free.len()
    }

    /// Places allocated (live or freed).
    pub fn capacity(&self) -> usize {
        self.items.capacity()
    }

    /// Room allocated for freed ids.
    pub fn free_capacity(&self) -> usize {
        self.free.capacity()
    }

    /// With no id live, gives every place's memory back (ids restart at 0).
    pub fn release_if_empty(&mut self) {
        if self.live() == 0 && self.items.capacity() > 0 {
            self.items = Vec::new();
            self.free = Vec::new();
        }
    }
}

impl<T> std::ops::Index<u32> for IdSlab<T> {
    type Output = T;
    fn index(&self, id: u32) -> &T {
        &self.items[id as usize]
    }
}

impl<T> std::ops::IndexMut<u32> for IdSlab<T> {
    fn index_mut(&mut self, id: u32) -> &mut T {
        &mut self.items[id as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_reused_last_freed_first_and_bounded() {
        let mut s = IdSlab::with_max_id(2);
        assert_eq!(
            (s.insert('a'), s.insert('b'), s.insert('c')),
            (Ok(0), Ok(1), Ok(2))
        );
        assert_eq!(s.insert('d'), Err(SlabFull { capacity: 3 }));
        s.remove(0);
        s.remove(2);
        assert_eq!(s.live(), 1);
        assert_eq!(s[2], 'c', "a freed item stays until reused");
        assert_eq!(
            s.insert_with(|old| old.map_or('?', |c| c.to_ascii_uppercase())),
            Ok(2)
        );
        assert_eq!(s[2], 'C');
        assert_eq!(s.insert('e'), Ok(0));
        assert!(!s.has_room());
    }
}
