"""Test doubles and builders shipped with edgetrain, for its tests and for users' own."""
