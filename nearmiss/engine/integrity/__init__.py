"""The integrity gate (anti-cheat): rules a candidate must satisfy to be certified."""
