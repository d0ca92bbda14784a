-- A MAC is unique within a site: two machines of one site with one MAC
-- would boot each other's entries. Kept from nodes.macs by a trigger, so
-- every write of the array is checked, whoever makes it (enroll, the
-- inspection's store-macs step, a full node update). MACs are compared in
-- one spelling: twelve lowercase hex digits. A retired node boots nothing
-- and holds no MAC, so the machine can be enrolled again.
CREATE FUNCTION canonical_mac(m TEXT) RETURNS TEXT
    LANGUAGE sql IMMUTABLE STRICT
    AS $$ SELECT lower(regexp_replace(m, '[^0-9A-Fa-f]', '', 'g')) $$;

CREATE TABLE node_macs (
    site_id TEXT NOT NULL,
    mac     TEXT NOT NULL,
    node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    CONSTRAINT node_macs_site_mac PRIMARY KEY (site_id, mac)
);
CREATE INDEX node_macs_node ON node_macs (node_id);

CREATE FUNCTION node_macs_sync() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND NEW.macs IS NOT DISTINCT FROM OLD.macs
       AND NEW.site_id = OLD.site_id
       AND (NEW.provision_state = 'retired') = (OLD.provision_state = 'retired') THEN
        RETURN NEW;
    END IF;
    DELETE FROM node_macs WHERE node_id = NEW.id;
    IF NEW.provision_state <> 'retired' THEN
        INSERT INTO node_macs (site_id, mac, node_id)
            SELECT DISTINCT NEW.site_id, canonical_mac(m), NEW.id
            FROM unnest(NEW.macs) AS m;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER node_macs_sync
    AFTER INSERT OR UPDATE OF macs, site_id, provision_state ON nodes
    FOR EACH ROW EXECUTE FUNCTION node_macs_sync();

-- Nodes enrolled before: where two already share a MAC, the older keeps it.
INSERT INTO node_macs (site_id, mac, node_id)
    SELECT DISTINCT ON (n.site_id, canonical_mac(m)) n.site_id, canonical_mac(m), n.id
    FROM nodes n, unnest(n.macs) AS m
    WHERE n.provision_state <> 'retired'
    ORDER BY n.site_id, canonical_mac(m), n.created_at
ON CONFLICT DO NOTHING;
