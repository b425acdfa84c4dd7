"""Everything about talking to the center: target grammar, certificate pins, the pooled client.

Must never: send a request byte (and so the bearer token) to a TLS peer whose certificate does
not match a configured pin.
"""
