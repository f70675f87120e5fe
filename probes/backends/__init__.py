"""Framework adapters. Each exposes the small interface of `probes.backends.base.Backend`;
the tools above are written once against it."""
