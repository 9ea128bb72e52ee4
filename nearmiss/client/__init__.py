"""The Temporal client side: workers (``service``), sessions and fleets started and followed
(``service``, ``fleet``), replay of recorded sessions (``replay``), the infrastructure failures
a worker rides out (``faults``) and where Temporal and PostgreSQL are (``settings``)."""
