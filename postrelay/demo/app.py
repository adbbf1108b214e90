"""`--app postrelay.demo.app`: the demo's email routes in the default registry, for a relay
on a real system — `docker compose up` runs its relay and worker with this module, and
`postrelay demo --emit` gives them the demo's events to send."""

from postrelay.demo.emails import demo_routes
from postrelay.relay import default_routes

demo_routes(default_routes)
