"""The builder service: runtime environments built from requirements, cached by content hash."""
