//! Tests of the VIP translator (virtual clock).
