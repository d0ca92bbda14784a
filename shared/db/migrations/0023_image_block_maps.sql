-- A raw image's block map (`dataRanges`): its runs of data, each with its
-- sha256, signed with the rest of the manifest. `bcd` fetches only the
-- runs. NULL: the image is streamed whole. The API checks the runs
-- (`bcm_core::deploy::check_data_ranges`) before they are stored.
ALTER TABLE images ADD COLUMN data_ranges JSONB
    CHECK (data_ranges IS NULL OR (jsonb_typeof(data_ranges) = 'array' AND format = 'raw'));
