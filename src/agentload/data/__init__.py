"""Data files shipped with the package: model and GPU catalogues and simulator profiles (TOML)."""
